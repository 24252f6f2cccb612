"""The process-per-trial runner rides out a restart of the PostgreSQL server that holds its study and its
host ledger: no exception leaves optimize() and every trial ends with its record."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

import optuna_memprune as omp
from optuna_memprune.ledger import HostCapacity, Ledger

sys.path.insert(0, str(Path(__file__).parent))
from _runner_objectives import fixed_footprint, nap  # noqa: E402

MiB = 2**20
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_optimize_rides_out_a_postgresql_restart(postgres_cluster) -> None:
    url = postgres_cluster.url()
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="400MiB"))
    study = optuna.create_study(storage=url, study_name="restart", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
                                pruner=guard.wrap_pruner())
    ledger = Ledger(HostCapacity(ram=500 * MiB), url=url, host="h")  # one 300 MiB trial at a time: one waits

    def restart() -> None:
        time.sleep(2.5)
        postgres_cluster.stop("fast")
        time.sleep(4.0)  # longer than the 3.1 s the runner's storage retries used to wait in all
        postgres_cluster.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        omp.optimize(study, nap, guard=guard, host=ledger, n_trials=8, n_workers=2, progress=False)
    finally:
        restarter.join()
    trials = optuna.load_study(storage=url, study_name="restart").trials
    assert len(trials) == 8
    assert all(t.state.is_finished() for t in trials), [t.state for t in trials]
    records = [omp.read_record(t.user_attrs) for t in trials]
    assert all(r is not None and r.reason for r in records), [t.user_attrs for t in trials]
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in trials[-2:])  # the study went on after it
    assert ledger.entries() == []
