"""Where the package keeps its files on this host: the cache directory of calibrations and ledgers.

Owns the directory's name, its environment overrides and the one check that it can be written; knows nothing
of what is stored there.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from .exceptions import MemPruneError

#: The environment variable that moves the cache directory.
ENV_VAR = "MEMPRUNE_CACHE_DIR"


class CacheDirError(MemPruneError):
    """The cache directory cannot be created or written: the message names it and what to do."""


def cache_dir() -> Path:
    """Where calibrations and per-host ledgers live: ``$MEMPRUNE_CACHE_DIR`` or ``~/.cache/optuna-memprune``
    (``$XDG_CACHE_HOME/optuna-memprune`` where that is set)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "optuna-memprune"


def writable_dir(directory: Path | str | None = None) -> Path:
    """``directory`` (default: ``cache_dir()``), created if missing, once a file was really created in it (and
    removed); else ``CacheDirError`` with one line naming the directory, why, and what to do.

    Examples:
        >>> open("a-file", "w").close()
        >>> writable_dir("a-file/cache")
        Traceback (most recent call last):
        ...
        optuna_memprune.paths.CacheDirError: cannot use 'a-file/cache' as the cache directory: a part of its
        path is a file, not a directory; set MEMPRUNE_CACHE_DIR to a writable directory.
    """
    path = cache_dir() if directory is None else Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise CacheDirError(
            f"cannot use {str(path)!r} as the cache directory: {_why(path, exc)}; "
            f"set {ENV_VAR} to a writable directory."
        ) from None
    return path


def _why(path: Path, exc: OSError) -> str:
    if exc.errno == errno.EEXIST or (path.exists() and not path.is_dir()):
        return "it is a file, not a directory"
    if exc.errno == errno.ENOTDIR:
        return "a part of its path is a file, not a directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system"
    return exc.strerror or str(exc)
