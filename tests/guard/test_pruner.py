"""GuardedPruner: delegation, the soft line, and the Hyperband warning."""

from __future__ import annotations

import time

import numpy as np
import optuna
import psutil
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.guard import Decision, GuardedPruner, MemoryGuard, read_record

MiB = 2**20
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_crossing_the_soft_line_makes_should_prune_answer_true() -> None:
    rss = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=rss + 300 * MiB)
    guard = MemoryGuard(lambda p: omp.Footprint.of(ram=rss), budget, soft=0.9, monitor_interval=0.02)
    study = optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
        pruner=guard.wrap_pruner(optuna.pruners.NopPruner()),
    )

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("x", 0, 1)
        # Between the soft line (90%) and the budget: the pruner answers True, nothing is interrupted.
        target = int(0.95 * budget.ram) - psutil.Process().memory_info().rss
        block = np.ones(max(target, 0), dtype=np.uint8)
        for step in range(100):
            trial.report(float(step), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
            time.sleep(0.01)
        return float(block[0])

    study.optimize(guard.wrap_objective(objective), n_trials=1)
    trial = study.trials[0]
    record = read_record(trial.user_attrs)
    assert trial.state is TrialState.PRUNED and record.decision is Decision.SOFT_PRUNED
    assert 0.9 * budget.ram < record.breach["rss"] <= budget.ram
    assert "soft line" in record.reason and max(trial.intermediate_values) < 99


def test_without_a_breach_it_answers_what_the_wrapped_pruner_answers() -> None:
    guard = MemoryGuard(lambda p: omp.Footprint.of(ram=MiB), omp.Budget(ram="64GiB"))
    median = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    study = optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()), pruner=guard.wrap_pruner(median)
    )
    answers = []

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("x", 0, 1)
        trial.report(1.0 if trial.number == 0 else 10.0, 0)
        answers.append((trial.should_prune(), median.prune(study, study._storage.get_trial(trial._trial_id))))
        return 1.0

    study.optimize(guard.wrap_objective(objective), n_trials=2)
    assert answers == [(False, False), (True, True)]
    assert GuardedPruner(None, guard).prune(study, study.trials[1]) is False


def test_wrapping_hyperband_warns_at_the_users_line() -> None:
    guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"))
    with pytest.warns(UserWarning, match="HyperbandPruner") as caught:
        guard.wrap_pruner(optuna.pruners.HyperbandPruner())
    assert caught[0].filename == __file__


def test_a_pruner_that_is_not_a_pruner_is_refused() -> None:
    guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"))
    with pytest.raises(TypeError, match="MedianPruner"):
        guard.wrap_pruner(optuna.pruners.MedianPruner)  # the class, not an instance
