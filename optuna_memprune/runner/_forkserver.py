"""The runner's fork server: one per process, started with the objective's module and heavy libraries
imported (before the first trial is asked), so that each trial's process starts fast; stopped when
``optimize`` returns.

An objective that says it needs no main module (``needs_main_module = False``: ``memprune run`` sends the
program's objective by cloudpickle, by value) gets trial processes that never import the program's
``__main__``: neither the server nor the trial runs the program's top level again (a script without
``if __name__ == "__main__":`` would start its whole search again in every trial's process).

Owns what the server preloads and whether its processes import the main module; knows nothing of trials,
guards or the ledger.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import sys
from collections.abc import Callable
from multiprocessing.context import ForkServerContext, ForkServerProcess
from typing import Any

from .. import _internals

_logger = logging.getLogger("optuna_memprune.guard")

# What the fork server imports once, so that a trial starts fast: the storage's stack always, the heavy
# libraries when this process has them loaded (so an objective that never uses torch does not pay its RSS).
# Without them each trial of a program sent by value (memprune run) imported its libraries itself: with
# them preloaded the median Keras trial of bench_clients (n_jobs=2) went from 2.59 s to 2.23 s.
_PRELOAD = ("optuna", "sqlalchemy", "alembic.migration", "alembic.script", *_internals.rdb_modules(), "psutil")
_PRELOAD_IF_LOADED = (
    "numpy",
    "pandas",
    "torch",
    "gymnasium",
    "stable_baselines3",
    "lightning",
    "pytorch_lightning",
    "transformers",
    "lightgbm",
    "xgboost",
    "sklearn",
    "tensorflow",
    "keras",
)

_SERVERS: dict[str, Any] = {}


class MainFreeProcess(ForkServerProcess):
    """A fork server's process that does not import the parent's main module (``_internals``)."""

    def start(self) -> None:
        with _internals.main_module_left_out():
            super().start()


class MainFreeContext(ForkServerContext):
    """The forkserver context whose processes are ``MainFreeProcess``."""

    Process = MainFreeProcess


def fork_server(objective: Callable[..., Any]) -> Any:
    """The forkserver context of this process (one server, started on first use with the preloads); its
    processes leave the main module out where the objective's ``needs_main_module`` is False."""
    if not _SERVERS:
        main_free = getattr(objective, "needs_main_module", True) is False
        ctx = MainFreeContext() if main_free else multiprocessing.get_context("forkserver")
        main = sys.modules.get("__main__")
        preload = [f"{__package__}._server_exit"]  # first: its exit handler runs last
        preload += [m for m in _PRELOAD if importlib.util.find_spec(m.split(".")[0]) is not None]
        preload += [m for m in _PRELOAD_IF_LOADED if m in sys.modules]
        module = getattr(objective, "__module__", None) or getattr(getattr(objective, "func", None), "__module__", None)
        if module and module != "__main__":
            preload.append(module)
        elif getattr(main, "__file__", None) and not main_free:
            preload.append("__main__")  # a script's objective: imported once by the server, not per trial
        ctx.set_forkserver_preload(preload)
        _SERVERS["ctx"] = ctx
        _warm(ctx)
    return _SERVERS["ctx"]


def _warm(ctx: Any) -> None:
    """Start the server now, its preloads imported, with one process that does nothing: the first trial's
    time then starts after it, not with it. In bench_clients (n_jobs=2) the first trials took 2.5-3.9 s
    against 0.3-1.3 s for the later ones, the server importing torch, transformers or TensorFlow. A server
    that cannot start is left to the first trial's launch, whose failure is handled as a trial's."""
    try:
        process = ctx.Process(target=_nothing, daemon=True)
        process.start()
        process.join()
    except Exception:  # the first launch meets it again, where it is reported
        _logger.debug("starting the fork server ahead of the first trial failed", exc_info=True)


def _nothing() -> None:
    """The warm-up process's target."""


def stop_fork_server() -> None:
    """Stop the fork server once ``optimize`` returns: a process of several hundred MiB (torch preloaded)
    must not outlive the call, nor count in the readings of an in-process guard of this process later."""
    if _SERVERS.pop("ctx", None) is not None:
        try:
            _internals.stop_fork_server()
        except Exception:  # already gone
            _logger.debug("stopping the fork server failed", exc_info=True)
