"""A script with no ``if __name__ == "__main__":`` that makes its study and runs it with n_jobs=2 at its top
level: ``python unguarded_jobs.py MARKS STATUS [lock|sampler|data|attrs]``. Its top level and each call of its
objective append a line to MARKS; it prints its trials and exits with STATUS. With ``lock`` the objective holds a
lock of the script's, which no pickler can send to another process; with ``sampler`` the study's sampler is a
class of the script, which plain pickle sends by name; with ``data`` the objective reads 200 MiB of data the
script's top level made (sent by value with the objective); with ``attrs`` each trial keeps numpy arrays as attrs,
as Optuna's terminator example reports ``cross_val_score``'s scores (an in-memory study holds any object)."""

import sys
import threading

import numpy as np
import optuna
from optuna.terminator import report_cross_validation_scores

import search_helper

MARKS = sys.argv[1]
LOCK = threading.Lock() if sys.argv[3:] == ["lock"] else None
DATA = np.ones(200 * 2**20 // 8) if sys.argv[3:] == ["data"] else None


class ScriptSampler(optuna.samplers.RandomSampler):
    """A sampler of the script's own."""


search_helper.mark(MARKS, "top level")


def objective(trial: optuna.Trial) -> float:
    rows = trial.suggest_int("rows", 10_000, 200_000, log=True)
    if LOCK is not None:
        with LOCK:
            search_helper.mark(MARKS, f"trial {trial.number}")
    else:
        search_helper.mark(MARKS, f"trial {trial.number}")
    if sys.argv[3:] == ["attrs"]:
        trial.set_user_attr("rows_seen", np.arange(3) * rows)
        report_cross_validation_scores(trial, np.array([0.5, 0.25, 0.75]))
    seen = 0.0 if DATA is None else float(DATA[::512].sum())
    return float(np.ones((rows, 8), dtype=np.float32).sum()) + seen


optuna.logging.set_verbosity(optuna.logging.WARNING)
sampler = (ScriptSampler if sys.argv[3:] == ["sampler"] else optuna.samplers.RandomSampler)(seed=0)
study = optuna.create_study(sampler=sampler)
study.optimize(objective, n_trials=6, n_jobs=2)
search_helper.report(study)
sys.exit(int(sys.argv[2]))
