"""The runner's fork server: one per process, started with the objective's module and heavy libraries
imported, so that each trial's process starts fast; stopped when ``optimize`` returns.

Owns what the server preloads; knows nothing of trials, guards or the ledger.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import sys
from typing import Any, Callable

from ... import _internals

_logger = logging.getLogger("optuna_memprune.guard")

# What the fork server imports once, so that a trial starts fast: the storage's stack always, the heavy
# libraries when this process has them loaded (so an objective that never uses torch does not pay its RSS).
_PRELOAD = ("optuna", "sqlalchemy", "alembic.migration", "alembic.script", *_internals.rdb_modules(), "psutil")
_PRELOAD_IF_LOADED = ("numpy", "torch", "gymnasium", "stable_baselines3")

_SERVERS: dict[str, Any] = {}


def fork_server(objective: Callable) -> Any:
    """The forkserver context of this process (one server, started on first use with the preloads)."""
    ctx = multiprocessing.get_context("forkserver")
    if not _SERVERS:
        main = sys.modules.get("__main__")
        preload = [m for m in _PRELOAD if importlib.util.find_spec(m.split(".")[0]) is not None]
        preload += [m for m in _PRELOAD_IF_LOADED if m in sys.modules]
        module = getattr(objective, "__module__", None) or getattr(getattr(objective, "func", None), "__module__", None)
        if module and module != "__main__":
            preload.append(module)
        elif getattr(main, "__file__", None):
            preload.append("__main__")  # a script's objective: imported once by the server, not per trial
        ctx.set_forkserver_preload(preload)
        _SERVERS["ctx"] = ctx
    return _SERVERS["ctx"]


def stop_fork_server() -> None:
    """Stop the fork server once ``optimize`` returns: a process of several hundred MiB (torch preloaded)
    must not outlive the call, nor count in the readings of an in-process guard of this process later."""
    if _SERVERS.pop("ctx", None) is not None:
        try:
            _internals.stop_fork_server()
        except Exception:  # noqa: BLE001 - already gone
            _logger.debug("stopping the fork server failed", exc_info=True)
