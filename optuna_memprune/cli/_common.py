"""What the ``memprune`` subcommands share: the usage error (exit 2), ``module:name`` loading and the
storage URL (``--storage`` or ``OPTUNA_STORAGE``).

Part of the CLI layer; prints nothing itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..exceptions import MemPruneError
from ..storages import ENV_VAR


class UsageError(MemPruneError):
    """A command line that asks for something impossible: exits 2, as argparse's own errors do."""


def load(spec: str, what: str) -> Any:
    """``module:attr`` (a module on sys.path or the current directory) -> the object."""
    import importlib

    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"{what} must be written module:name (e.g. mystudy:objective), but got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise MemPruneError(f"{what} {spec!r} could not be loaded: {exc}") from exc
    return obj


def storage_url(args: argparse.Namespace) -> str:
    url = args.storage or os.environ.get(ENV_VAR)
    if not url:
        raise UsageError(f"give the study's storage URL (or set {ENV_VAR})")
    return url
