"""The footprint cache keeps each answer under the params the function read: a call is saved where only a
param the function never reads changed, and never answered from a call that read something else."""

from __future__ import annotations

import pytest

from optuna_memprune import Footprint
from optuna_memprune.guard._cache import FootprintCache


def _counted(function):  # type: ignore[no-untyped-def]
    calls = []

    def footprint(p):  # type: ignore[no-untyped-def]
        calls.append(1)  # (reading the params here would read them whole)
        return Footprint.of(ram=function(p))

    return FootprintCache(footprint, None), calls


def test_a_param_the_function_never_reads_costs_no_call() -> None:
    cache, calls = _counted(lambda p: p["width"] * p["batch"])
    assert cache({"width": 4, "batch": 2, "lr": 0.1}).ram == 8
    assert cache({"width": 4, "batch": 2, "lr": 0.01}).ram == 8 and len(calls) == 1
    assert cache({"width": 4, "batch": 3, "lr": 0.1}).ram == 12 and len(calls) == 2
    assert cache({"batch": 2, "width": 4}).ram == 8 and len(calls) == 2  # a param fewer, still not read


def test_a_branch_that_reads_other_params_is_answered_by_its_own_calls() -> None:
    cache, calls = _counted(lambda p: p["x"] if p["kind"] == "a" else p["y"])
    assert cache({"kind": "a", "x": 1, "y": 5}).ram == 1
    assert cache({"kind": "b", "x": 1, "y": 5}).ram == 5
    assert cache({"kind": "b", "x": 2, "y": 5}).ram == 5 and len(calls) == 2
    assert cache({"kind": "a", "x": 1, "y": 7}).ram == 1 and len(calls) == 2
    assert cache({"kind": "a", "x": 3, "y": 7}).ram == 3 and len(calls) == 3


@pytest.mark.parametrize(
    "function",
    [
        lambda p: sum(p.values()),
        lambda p: len(p),
        lambda p: len(str(p)),
        lambda p: sum(v for _, v in p.items()),
        lambda p: sum(dict(p).values()),
        lambda p: (lambda **kw: sum(kw.values()))(**p),
        lambda p: p.setdefault("a", 0) + p["a"],
    ],
)
def test_a_call_that_reads_the_params_whole_is_kept_by_all_of_them(function) -> None:  # type: ignore[no-untyped-def]
    cache, calls = _counted(function)
    first = cache({"a": 1, "b": 2})
    assert cache({"a": 1, "b": 2}) is first and len(calls) == 1
    cache({"a": 1, "b": 3})
    assert len(calls) == 2


def test_a_name_asked_for_and_absent_counts_as_read() -> None:
    cache, calls = _counted(lambda p: p.get("extra", 3) + (10 if "flag" in p else 0))
    assert cache({"n": 1}).ram == 3 and cache({"n": 2}).ram == 3 and len(calls) == 1
    assert cache({"n": 1, "extra": 4}).ram == 4 and cache({"n": 1, "flag": 1}).ram == 13 and len(calls) == 3


def test_a_missing_param_still_raises_a_key_error_naming_it() -> None:
    cache, _ = _counted(lambda p: p["missing"])
    with pytest.raises(KeyError) as missing:
        cache({"n": 1})
    assert type(missing.value) is KeyError and missing.value.args == ("missing",)
