"""MemoryGuard: argument checks that name what was wrong, pickling, and the footprint cache."""

from __future__ import annotations

import pickle

import optuna
import pytest
from optuna.distributions import IntDistribution

import optuna_memprune as omp
from optuna_memprune.guard import GuardedPruner, GuardedSampler, MemoryGuard
from optuna_memprune.guard.backend import policy_of, trials_of


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"on_infeasible": "skip"}, ValueError, "'skip'"),
        ({"clamp": ["widht"], "search_space": {"width": IntDistribution(1, 2)}}, ValueError, "widht"),
        ({"clamp": "width"}, TypeError, "'width'"),
        ({"clamp": ["x"], "on_infeasible": "reject"}, ValueError, "reject"),
        ({"search_space": {"x": (1, 2)}}, TypeError, "search_space"),
        ({"monitor_interval": 0}, ValueError, "monitor_interval"),
        ({"soft": 1.5}, ValueError, "1.5"),
    ],
)
def test_bad_construction_input_names_what_was_wrong(kwargs, error, words) -> None:
    with pytest.raises(error, match=words):
        MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), **kwargs)


def test_bad_budget_footprint_or_sampler_names_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MemoryGuard(lambda p: omp.Footprint(), omp.Budget())
    with pytest.raises(TypeError, match="Budget"):
        MemoryGuard(lambda p: omp.Footprint(), {"ram": "1GiB"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        MemoryGuard("footprint", omp.Budget(ram="1GiB"))  # type: ignore[arg-type]
    guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"))
    with pytest.raises(TypeError, match="str"):
        guard.wrap_sampler("tpe")  # type: ignore[arg-type]


def _footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=params.get("n", 0))


def test_the_guard_pickles_its_configuration_and_not_its_running_state() -> None:
    guard = MemoryGuard(
        _footprint,
        omp.Budget(ram="1GiB", threads=8),
        on_infeasible="clamp",
        clamp=["n"],
        search_space={"n": IntDistribution(0, 10)},
        soft=0.8,
    )
    policy_of(guard).predict({"n": 3})
    again = pickle.loads(pickle.dumps(guard))
    assert again.budget == guard.budget and policy_of(again).clamp == ("n",) and policy_of(again).soft == 0.8
    assert policy_of(again).cached_footprints == 0 and trials_of(again).registered() == {}
    assert isinstance(again.wrap_sampler(optuna.samplers.RandomSampler()), GuardedSampler)
    assert isinstance(again.wrap_pruner(), GuardedPruner)


def test_a_study_with_the_guarded_sampler_and_pruner_survives_plain_pickle() -> None:
    """rl-zoo3 pickles its study at the end of a search: the wrapped sampler and pruner must come along."""
    guard = MemoryGuard(_footprint, omp.Budget(ram="1GiB"), search_space={"n": IntDistribution(0, 10)})
    study = optuna.create_study(
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=1)),
        pruner=guard.wrap_pruner(optuna.pruners.MedianPruner()),
    )
    study.optimize(guard.wrap_objective(lambda t: t.suggest_int("n", 0, 10)), n_trials=3)
    again = pickle.loads(pickle.dumps(study))
    assert isinstance(again.sampler, GuardedSampler)
    assert isinstance(again.sampler.base_sampler, optuna.samplers.TPESampler)
    assert isinstance(again.pruner, GuardedPruner)
    again.optimize(lambda t: t.suggest_int("n", 0, 10), n_trials=1)  # the unpickled sampler checks and records
    assert omp.read_record(again.trials[-1].user_attrs).decision.value == "admitted"


def test_footprints_are_cached_per_params() -> None:
    calls = []

    def footprint(params: dict) -> omp.Footprint:
        calls.append(params)
        return omp.Footprint.of(ram=params["n"])

    guard = MemoryGuard(footprint, omp.Budget(ram="1GiB"))
    assert policy_of(guard).predict({"n": 1, "m": "a"}) is policy_of(guard).predict({"m": "a", "n": 1})
    assert len(calls) == 1
