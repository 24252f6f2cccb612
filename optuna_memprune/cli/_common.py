"""What the ``memprune`` subcommands share: the usage error (exit 2), ``module:name`` loading, the
storage URL (``--storage`` or ``OPTUNA_STORAGE``) and the output format (``-f/--format``).

Part of the CLI layer; prints nothing itself.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..exceptions import MemPruneError
from ..storages import ENV_VAR, as_url


class UsageError(MemPruneError):
    """A command line that asks for something impossible: exits 2, as argparse's own errors do."""


def load(spec: str, what: str) -> Any:
    """``module:attr`` (a module on sys.path or the current directory) -> the object."""
    from ..run import import_object

    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"{what} must be written module:name (e.g. mystudy:objective), but got {spec!r}")
    try:
        return import_object(module, attr)
    except (ImportError, AttributeError) as exc:
        raise MemPruneError(f"{what} {spec!r} could not be loaded: {exc}") from exc


def storage_url(args: argparse.Namespace) -> str:
    url = args.storage or os.environ.get(ENV_VAR)
    if not url:
        raise UsageError(f"give the study's storage URL (or set {ENV_VAR})")
    return as_url(url)


def output_format(args: argparse.Namespace) -> str:
    """The ``-f/--format`` a command was given, else ``"table"``."""
    format_: str | None = getattr(args, "format", None)
    return format_ or "table"
