"""Where the package keeps its files on this host: the cache directory of calibrations and ledgers.

Owns the directory's name and its environment overrides; knows nothing of what is stored there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where calibrations and per-host ledgers live: ``$MEMPRUNE_CACHE_DIR`` or ``~/.cache/optuna-memprune``
    (``$XDG_CACHE_HOME/optuna-memprune`` where that is set)."""
    env = os.environ.get("MEMPRUNE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "optuna-memprune"
