"""The learned footprint's numerics, arrays in and arrays out: non-negative least squares (SciPy's where the
program imported it, else Lawson and Hanson's active set in numpy: the core install has no SciPy), the
relative-error fit, the fit with censored trials ("at least this much") and its leave-one-out predictions.

Knows nothing of params, encoders, trials or resources: ``learn.py`` builds the matrices and reads the fits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SCORED", "fit_censored", "loo", "nnls", "predict", "solve"]

SCORED = 40  # the most recent observations scored by leave-one-out (older ones are fitted only)
_IMPUTE_ROUNDS = 3  # censored targets raised to the fit this many times
_CENSORED_WEIGHT = 10.0  # the weight of a censored trial the fit puts below what it reached


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200, start: np.ndarray | None = None) -> np.ndarray:
    """Non-negative least squares (Lawson and Hanson's active set): ``argmin |a w - b|, w >= 0``.

    ``start``: the columns a nearby problem's answer used (its weights > 0, the same columns): where their
    least squares are all positive the search starts there (one solve instead of one per column taken, as a
    leave-one-out fit's columns are nearly always the full fit's); else from none. The answer is the same: the
    search ends only where no column left out would lower the error. Where SciPy's optimizer is already
    imported, its compiled solver answers instead (the same answer, 13 us against 0.44 ms on 40 x 12 here);
    it is never imported for this (48.9 MiB and 0.27 s in a trial's process).

    Examples:
        >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0])).tolist()
        [2.0, 0.0]
    """
    compiled = _compiled()
    if compiled is not None:
        try:
            return np.asarray(compiled(a, b)[0], dtype=float)
        except (RuntimeError, ValueError):  # its iteration limit, a value it refuses: the numpy search answers
            pass
    # each column scaled to unit norm: the stopping test compares gradients, which in bytes per unit of a param
    # over relative errors were 1e-12 (below any absolute floor, ending the search with a column left that
    # would have cut the error 15-fold), and the solves are better conditioned; scaled back at the end
    norms = np.linalg.norm(a, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    a = a / scale
    w = np.zeros(a.shape[1])
    passive = np.zeros(a.shape[1], dtype=bool)
    if start is not None and start.any():
        s = np.zeros_like(w)
        s[start] = np.linalg.lstsq(a[:, start], b, rcond=None)[0]
        if (s[start] > 0).all():
            w, passive = s, start.copy()
    for _ in range(iterations):
        grad = a.T @ (b - a @ w)
        free = ~passive & (grad > 1e-12 * max(1.0, float(np.abs(grad).max())))
        if not free.any():
            break
        passive[int(np.argmax(np.where(free, grad, -np.inf)))] = True
        while passive.any():
            s = np.zeros_like(w)
            s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (s[passive] > 0).all():
                w = s
                break
            neg = passive & (s <= 0)
            w = w + np.min(w[neg] / np.maximum(w[neg] - s[neg], 1e-300)) * (s - w)
            passive &= w > 1e-12
            w[~passive] = 0.0
    return w / scale


def _compiled() -> Callable[..., Any] | None:
    """SciPy's ``nnls`` where ``scipy.optimize`` is already imported (LightGBM, scikit-learn and XGBoost import
    it), else None."""
    return getattr(sys.modules.get("scipy.optimize"), "nnls", None)


def solve(x: np.ndarray, y: np.ndarray, boost: np.ndarray | None = None, start: np.ndarray | None = None) -> np.ndarray:
    """The relative-error non-negative fit of ``y`` on the rows ``x`` (rows weighted ``boost`` times more).

    Errors are relative to at least 1% of the largest ``y``, as ``learn.py`` scores them: a trial's own
    increment in a shared process may be near 0 (it reused what earlier trials freed), and weighed by
    1 / 0.13 MiB two such trials outweighed four stopped at 48-204 MiB 1500 to 1 and flattened the fit."""
    weight = 1.0 / np.maximum(y, 0.01 * max(float(y.max()), 1.0))
    if boost is not None:
        weight = weight * boost
    return nnls(x * weight[:, None], y * weight, start=start)


def fit_censored(x: np.ndarray, y: np.ndarray, censored: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """The fit, a censored trial's target raised to the fit where the fit says it needed more; ``start``: the
    columns a nearby fit used (``nnls``), each step then starting from the columns of the one before."""
    done = ~censored
    # first the trials that ran to the end (a censored peak far below the fit must not bend it), then each
    # censored target raised to the fit wherever the fit says it needed more than it reached
    w = solve(x[done], y[done], start=start) if done.sum() >= 2 else solve(x, y, start=start)
    last: tuple[np.ndarray, np.ndarray] | None = None
    for _ in range(_IMPUTE_ROUNDS if censored.any() else 0):
        fit = predict(x, w)
        target = np.where(censored, np.maximum(y, fit), y)
        # a censored trial the fit puts under what it reached is a hard fact the fit must meet: weighed more
        boost = np.where(censored & (fit < y), _CENSORED_WEIGHT, 1.0)
        if last is not None and np.array_equal(target, last[0]) and np.array_equal(boost, last[1]):
            break  # the round before solved this very problem
        w, last = solve(x, target, boost, start=w > 0), (target, boost)
    return w


def predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The fit of the rows ``x`` under the weights ``w``, never below 0."""
    fit: np.ndarray = np.maximum(x @ w, 0.0)
    return fit


def loo(x: np.ndarray, y: np.ndarray, censored: np.ndarray, full: np.ndarray | None = None) -> np.ndarray:
    """The leave-one-out fit of the last ``SCORED`` observations (NaN where the rest hold no trial that ran
    to the end); ``full``: the fit of them all (``fit_censored``), whose columns each fit starts from."""
    start = None if full is None else full > 0
    out = []
    for i in range(max(0, len(y) - SCORED), len(y)):
        keep = np.arange(len(y)) != i
        ok = (~censored[keep]).any()
        w = fit_censored(x[keep], y[keep], censored[keep], start) if ok else None
        out.append(float(predict(x[i : i + 1], w)[0]) if w is not None else np.nan)
    return np.array(out)
