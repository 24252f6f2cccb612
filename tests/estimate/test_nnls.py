"""The learned footprint's solver: the numpy search against SciPy's on the scales the learned fit gives it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from optuna_memprune.estimate import _nnls


def _error(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> float:
    return float(np.sum((a @ w - b) ** 2))


def _problems(seed: int = 0, count: int = 200) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows weighted by 1 / peak (about 1e-9 per byte) times params from 1 to 1e4 and their products, as the
    learned fit's matrices are, with targets near 1: columns 1e-12 to 1e-3 in norm."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        rows, cols = int(rng.integers(6, 41)), int(rng.integers(2, 9))
        a = rng.random((rows, cols)) * 10.0 ** rng.uniform(-12, -3, cols)
        truth = np.where(rng.random(cols) < 0.6, rng.random(cols), 0.0) / np.linalg.norm(a, axis=0)
        b = a @ truth + rng.normal(0, 0.05, rows)
        out.append((a, b))
    return out


@pytest.fixture
def scipy_nnls(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """SciPy's NNLS, the reference. ``scipy.optimize`` leaves ``sys.modules`` again after the test where it was
    not there before: the rest of the suite fits with the numpy search (the core install's), whatever the
    order the tests run in."""
    had = "scipy.optimize" in sys.modules
    import scipy.optimize

    if not had:
        request.addfinalizer(lambda: sys.modules.pop("scipy.optimize", None))
    return scipy.optimize.nnls


@pytest.fixture
def numpy_only(monkeypatch: pytest.MonkeyPatch, scipy_nnls: Callable[..., Any]) -> Callable[..., Any]:
    monkeypatch.setattr(_nnls, "_compiled", lambda: None)  # SciPy is imported here: the numpy search answers
    return scipy_nnls


def test_the_numpy_search_reaches_the_least_squares_answer_at_any_column_scale(numpy_only: Callable[..., Any]) -> None:
    # A search stopping on gradients below an absolute 1e-12 ended short on such columns: a keras fit's
    # leave-one-out solve kept two of four columns at 15 times the least error
    for a, b in _problems():
        w, best = _nnls.nnls(a, b), numpy_only(a, b)[0]
        assert (w >= 0).all()
        assert _error(a, b, w) <= _error(a, b, best) * (1 + 1e-9) + 1e-24


def test_a_warm_start_gives_the_answer_of_a_cold_one(numpy_only: None) -> None:
    rng = np.random.default_rng(1)
    for a, b in _problems(seed=2, count=100):
        cold = _nnls.nnls(a, b)
        for start in (cold > 0, ~(cold > 0), np.ones(a.shape[1], dtype=bool), rng.random(a.shape[1]) < 0.5):
            warm = _nnls.nnls(a, b, start=start)
            assert _error(a, b, warm) <= _error(a, b, cold) * (1 + 1e-9) + 1e-24


def test_the_censored_fits_left_one_out_are_those_of_cold_starts(numpy_only: None) -> None:
    rng = np.random.default_rng(3)
    x = np.column_stack([np.ones(30), rng.uniform(1, 1e4, 30), rng.uniform(1, 64, 30)])
    y = 3e8 + x[:, 1] * 2e4 + x[:, 2] * 1e6 * rng.uniform(0.9, 1.1, 30)
    censored = rng.random(30) < 0.3
    y[censored] *= 0.8  # stopped before their peak
    full = _nnls.fit_censored(x, y, censored)
    np.testing.assert_allclose(_nnls.loo(x, y, censored, full), _nnls.loo(x, y, censored), rtol=1e-9)


def test_scipys_solver_answers_where_the_program_imported_it_and_is_never_imported_for_it(
    scipy_nnls: Callable[..., Any],
) -> None:
    a, b = _problems(seed=4, count=1)[0]
    assert _nnls._compiled() is not None  # this process imported scipy.optimize
    np.testing.assert_allclose(_nnls.nnls(a, b), scipy_nnls(a, b)[0], rtol=1e-9, atol=1e-12)
    code = (
        "import sys, numpy as np\n"
        "from optuna_memprune.estimate import learn\n"
        "w = learn.nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0]))\n"
        "assert w.tolist() == [2.0, 0.0], w\n"
        "assert 'scipy.optimize' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
