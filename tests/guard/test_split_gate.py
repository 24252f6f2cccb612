"""The whole-process admission gate of ``memprune run``'s jobs that stay threads: trials whose predictions
fit under the line together run at once; the gate reads each trial's check before its objective runs."""

from __future__ import annotations

import threading
import time

import optuna
from optuna.distributions import IntDistribution

import optuna_memprune as omp
from optuna_memprune.run._split import Gate

MiB = 2**20


def test_trials_whose_predictions_fit_together_run_at_once() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=p["n"] * MiB), omp.Budget(ram="1GiB"), search_space={"n": IntDistribution(1, 10)}
    )
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(0)))
    lock, running, most = threading.Lock(), [0], [0]

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("n", 1, 10)
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.5)
        with lock:
            running[0] -= 1
        return 0.0

    study.optimize(Gate(objective, guard, 100 * MiB), n_trials=4, n_jobs=2)
    assert most[0] == 2  # each predicted at most 10 MiB of a 100 MiB line: read as the whole line, one at a time
