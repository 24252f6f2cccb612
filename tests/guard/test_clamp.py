"""ClampSearch with plain callables: grids, log-scale floats, categorical choices, nothing that fits."""

from __future__ import annotations

import math

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

import optuna_memprune as omp
from optuna_memprune.guard._clamp import ClampSearch

LIMIT = 1000


def _search(ram) -> ClampSearch:  # type: ignore[no-untyped-def]
    def predict(params: dict) -> omp.Footprint:
        return omp.Footprint.of(ram=ram(params))

    return ClampSearch(predict, lambda f: {"ram": f.ram - LIMIT} if f.ram > LIMIT else {}, {"ram": LIMIT})


def test_an_int_on_a_step_grid_goes_to_the_highest_value_that_fits() -> None:
    search = _search(lambda p: 10 * p["batch"])
    space = {"batch": IntDistribution(8, 512, step=8)}
    clamped, footprint = search.clamp({"batch": 512}, space, ["batch"], omp.Footprint.of(ram=5120))
    assert clamped == {"batch": 96} and footprint.ram == 960  # 104 x 10 would cross 1000


def test_a_log_float_is_bisected_on_its_log_scale_to_just_under_the_line() -> None:
    search = _search(lambda p: int(p["x"] * 10))
    value, footprint, fits = search.lower_one({"x": 1000.0}, "x", FloatDistribution(1.0, 1000.0, log=True))
    assert fits and footprint.ram <= LIMIT and math.isclose(value, 100.0, rel_tol=1e-3)


def test_the_param_that_removes_most_excess_per_range_is_lowered_first() -> None:
    search = _search(lambda p: p["a"] + 100 * p["b"])
    # both remove the whole excess at their low end; b does it over half its range, a over 5/6 of its own
    space = {"a": IntDistribution(0, 600), "b": IntDistribution(0, 20)}
    clamped, _ = search.clamp({"a": 500, "b": 10}, space, ["a", "b"], omp.Footprint.of(ram=1500))
    assert clamped == {"a": 500, "b": 5}
    space["a"] = IntDistribution(0, 5000)  # now a removes it over a tenth of its range: a goes first
    clamped, _ = search.clamp({"a": 500, "b": 10}, space, ["a", "b"], omp.Footprint.of(ram=1500))
    assert clamped == {"a": 0, "b": 10}


def test_categorical_choices_are_lowered_by_footprint_when_they_are_not_numbers() -> None:
    sizes = {"small": 100, "medium": 900, "large": 5000}
    search = _search(lambda p: sizes[p["net"]])
    space = {"net": CategoricalDistribution(["medium", "large", "small"])}
    clamped, _ = search.clamp({"net": "large"}, space, ["net"], omp.Footprint.of(ram=5000))
    assert clamped == {"net": "medium"}


def test_none_when_even_the_lowest_values_do_not_fit() -> None:
    search = _search(lambda p: 2000 + p["n"])
    assert search.clamp({"n": 5}, {"n": IntDistribution(0, 5)}, ["n"], omp.Footprint.of(ram=2005)) is None
