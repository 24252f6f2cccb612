"""An objective whose module the runner's fork server preloads (it is the objective's module), and which
notes how each process that imported it ended, in the folder ``MEMPRUNE_TEST_NOTES`` names: ``atexit-<pid>``
when its exit handlers ran, ``teardown-<pid>`` when the interpreter tore its modules down.

Run from this folder (``python _server_exit_objective.py STORAGE``): Python 3.11's fork server leaves out
the parent's ``sys.path`` and finds its preloads from its working directory."""

from __future__ import annotations

import atexit
import os
import sys

import optuna

NOTES = os.environ.get("MEMPRUNE_TEST_NOTES", "")


def _note(what: str, notes: str = NOTES, getpid=os.getpid, touch=open) -> None:  # bound now: teardown clears globals
    if notes:
        touch(os.path.join(notes, f"{what}-{getpid()}"), "w").close()


class _Teardown:
    def __del__(self, note=_note) -> None:
        note("teardown")


atexit.register(_note, "atexit")
_kept = _Teardown()  # deleted when the interpreter clears this module at its teardown


def objective(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", 0.0, 1.0)


if __name__ == "__main__":
    import optuna_memprune as omp
    from _server_exit_objective import objective as preloaded  # its module's name, as the server imports it

    study = optuna.create_study(storage=sys.argv[1])
    omp.optimize(study, preloaded, guard=omp.MemoryGuard(None, omp.Budget(ram="2GiB")), n_trials=2)
    print(os.getpid(), [t.state.name for t in study.trials])
