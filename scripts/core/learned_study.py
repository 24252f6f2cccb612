"""A study guarded in process by a learned footprint (``MemoryGuard(None, ...)``): numpy arrays of
``rows`` x 16 float64, where the budget is exceeded above about 4 million rows. No torch anywhere.

Run by ``scripts/core_check.py`` as ``python learned_study.py STORAGE_URL``.
"""

import sys

import numpy as np
import optuna

import optuna_memprune as omp

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial):
    rows = trial.suggest_int("rows", 10_000, 8_000_000, log=True)
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    a = np.ones((rows, 16))
    return float(a[:, 0].sum() * lr)


guard = omp.MemoryGuard(None, omp.Budget(ram="700MiB"))
study = optuna.create_study(
    storage=sys.argv[1],
    study_name="learned",
    sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=0)),
    pruner=guard.wrap_pruner(optuna.pruners.NopPruner()),
)
study.optimize(guard.wrap_objective(objective), n_trials=20)
decisions = [omp.read_record(t.user_attrs).decision.value for t in study.trials]
print("decisions", " ".join(decisions))
