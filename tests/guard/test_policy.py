"""Policy: the rules the wrappers and the runner share (soft line, excess, breaches in words, records)."""

from __future__ import annotations

import pickle

import pytest

import optuna_memprune as omp
from optuna_memprune.guard import Decision, MemoryGuard
from optuna_memprune.guard._outcome import trial_outcome
from optuna_memprune.guard._trials import TrialGuardState
from optuna_memprune.guard.backend import policy_of
from optuna_memprune.monitor import Reading

MiB = 2**20


def _footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=params.get("n", 0) * MiB, threads=params.get("t", 1))


def _policy(**budget):  # type: ignore[no-untyped-def]
    return policy_of(MemoryGuard(_footprint, omp.Budget(**budget), soft=0.5))


def _reading(rss: int = 0, threads: int = 1, vram: int | None = None) -> Reading:
    return Reading(t=0.0, rss=rss, hwm=rss, threads=threads, processes=1, pss=None, vram=vram)


def test_the_soft_line_is_what_a_prediction_is_measured_against() -> None:
    policy = _policy(ram=100 * MiB, threads=8)
    assert policy.limits == {"ram": 50 * MiB, "threads": 4}
    assert policy.excess(policy.predict({"n": 50, "t": 4})) == {}
    assert policy.excess(policy.predict({"n": 60, "t": 6})) == {"ram": 10 * MiB, "threads": 2}
    assert policy.describe_excess(policy.predict({"n": 60})) == "RAM 60.00 MiB > 50.00 MiB (50% of the budget)"
    assert policy.describe_figures(policy.predict({"n": 60, "t": 6})) == "now RAM 60.00 MiB, threads 6"


def test_readings_are_measured_against_a_fraction_of_the_budget() -> None:
    policy = _policy(ram=100 * MiB, vram=10 * MiB)
    assert not policy.over(_reading(rss=50 * MiB), 0.5)
    assert policy.over(_reading(rss=51 * MiB), 0.5) and not policy.over(_reading(rss=51 * MiB), 1.0)
    assert policy.over(_reading(vram=11 * MiB), 1.0)
    assert policy.describe_breach(_reading(rss=120 * MiB, vram=11 * MiB), 1.0) == (
        "RSS 120.00 MiB over the budget 100.00 MiB, VRAM 11.00 MiB over the budget 10.00 MiB"
    )
    assert policy.describe_breach(_reading(rss=60 * MiB), 0.5) == "RSS 60.00 MiB over 50% of the budget 100.00 MiB"
    assert policy.describe_breach(None, 1.0) == "no reading"


def test_the_record_falls_back_to_the_launch_decision_and_notices_changed_params() -> None:
    policy = _policy(ram=100 * MiB)
    state = TrialGuardState(
        1, 0, decision=Decision.ADMITTED, reason="fits", assignment={"n": 10}, prediction=policy.predict({"n": 10})
    )
    record = policy.record(state, {"n": 10}, peaks={"ram": 5 * MiB})
    assert (record.decision, record.reason, record.pred_ram, record.peak_ram) == (
        Decision.ADMITTED,
        "fits",
        10 * MiB,
        5 * MiB,
    )
    assert record.budget_ram == 100 * MiB and record.soft == 0.5
    changed = policy.record(state, {"n": 20})
    assert changed.decision is Decision.UNCHECKED and "['n'] ran with values the guard did not check" in changed.reason
    assert changed.pred_ram == 20 * MiB  # predicted after the run, from the params that ran


def test_the_policy_pickles_its_configuration_and_not_its_cache() -> None:
    policy = _policy(ram=100 * MiB)
    policy.predict({"n": 1})
    again = pickle.loads(pickle.dumps(policy))
    assert policy.cached_footprints == 1 and again.cached_footprints == 0
    assert again.budget == policy.budget and again.soft == 0.5 and again.predict({"n": 2}).ram == 2 * MiB


@pytest.mark.parametrize(
    "kwargs, decision, reason",
    [
        ({"stopped_by": "by the runner"}, Decision.STOPPED, "stopped by the runner: RSS 120.00 MiB over the budget"),
        ({"soft_pruned": True}, Decision.SOFT_PRUNED, "pruned at the soft line: RSS 60.00 MiB over 50% of the budget"),
        ({"failed": "the objective raised KeyError"}, None, "launch; the objective raised KeyError"),
        ({}, None, None),
    ],
)
def test_the_outcome_of_a_trial_that_ran(kwargs, decision, reason) -> None:
    policy = _policy(ram=100 * MiB)
    hard = _reading(rss=120 * MiB) if "stopped_by" in kwargs else None
    soft = _reading(rss=60 * MiB)
    end = trial_outcome(policy, "launch", soft_reading=soft, hard_reading=hard, **kwargs)
    assert end.decision is decision
    assert (end.reason is None) if reason is None else end.reason.startswith(reason)
    assert end.breach == (hard or soft)


def test_a_crossing_that_did_not_stop_the_trial_is_said_with_why() -> None:
    policy = _policy(ram=100 * MiB)
    hard = _reading(rss=120 * MiB)
    end = trial_outcome(
        policy,
        "launch",
        soft_reading=None,
        hard_reading=hard,
        failed="ignored",
        ended_first="the objective ended first or caught the interrupt",
    )
    assert end.decision is None and end.breach == hard
    assert end.reason == (
        "launch; crossed the budget (RSS 120.00 MiB over the budget 100.00 MiB) "
        "but the objective ended first or caught the interrupt"
    )
