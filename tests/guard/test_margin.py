"""The learned margin: a safe default before evidence, a high quantile of observed/predicted after it."""

from __future__ import annotations

import math

import pytest

from optuna_memprune.guard._margin import DEFAULT_MARGIN, margin


def test_few_pairs_keep_the_default_unless_a_ratio_exceeds_it() -> None:
    assert margin([]) == DEFAULT_MARGIN
    assert margin([(1.1, 1.0)] * 2) == DEFAULT_MARGIN
    assert margin([(2.0, 1.0)]) == 2.0  # one trial above the default raises it at once


def test_enough_pairs_give_the_quantile_never_below_one() -> None:
    assert round(margin([(1.02, 1.0)] * 9 + [(0.9, 1.0)]), 3) == 1.02
    assert margin([(0.5, 1.0)] * 20) == 1.0  # over-predicting footprints: the prediction itself
    ratios = [(1.0 + i / 100, 1.0) for i in range(101)]
    assert math.isclose(margin(ratios, quantile=0.5), 1.5)


def test_unusable_pairs_are_ignored() -> None:
    pairs = [(1.0, 0.0), (math.inf, 1.0), (1.0, math.nan), (-1.0, 1.0)] + [(1.1, 1.0)] * 5
    assert math.isclose(margin(pairs), 1.1)


@pytest.mark.parametrize("kwargs, words", [({"default": 0.9}, "default"), ({"quantile": 0.0}, "quantile")])
def test_bad_arguments_name_what_was_wrong(kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        margin([], **kwargs)
