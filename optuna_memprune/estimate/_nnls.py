"""The learned footprint's numerics, arrays in and arrays out: Lawson and Hanson's non-negative least squares
(numpy's active set: the core install has no scipy), the relative-error fit, the fit with censored trials
("at least this much") and its leave-one-out predictions.

Knows nothing of params, encoders, trials or resources: ``learn.py`` builds the matrices and reads the fits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SCORED", "fit_censored", "loo", "nnls", "predict", "solve"]

SCORED = 40  # the most recent observations scored by leave-one-out (older ones are fitted only)
_IMPUTE_ROUNDS = 3  # censored targets raised to the fit this many times
_CENSORED_WEIGHT = 10.0  # the weight of a censored trial the fit puts below what it reached


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson and Hanson's active set): ``argmin |a w - b|, w >= 0``.

    Examples:
        >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0])).tolist()
        [2.0, 0.0]
    """
    w = np.zeros(a.shape[1])
    passive = np.zeros(a.shape[1], dtype=bool)
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
    return w


def solve(x: np.ndarray, y: np.ndarray, boost: np.ndarray | None = None) -> np.ndarray:
    """The relative-error non-negative fit of ``y`` on the rows ``x`` (rows weighted ``boost`` times more).

    Errors are relative to at least 1% of the largest ``y``, as ``learn.py`` scores them: a trial's own
    increment in a shared process may be near 0 (it reused what earlier trials freed), and weighed by
    1 / 0.13 MiB two such trials outweighed four stopped at 48-204 MiB 1500 to 1 and flattened the fit."""
    weight = 1.0 / np.maximum(y, 0.01 * max(float(y.max()), 1.0))
    if boost is not None:
        weight = weight * boost
    return nnls(x * weight[:, None], y * weight)


def fit_censored(x: np.ndarray, y: np.ndarray, censored: np.ndarray) -> np.ndarray:
    """The fit, a censored trial's target raised to the fit where the fit says it needed more."""
    done = ~censored
    # first the trials that ran to the end (a censored peak far below the fit must not bend it), then each
    # censored target raised to the fit wherever the fit says it needed more than it reached
    w = solve(x[done], y[done]) if done.sum() >= 2 else solve(x, y)
    for _ in range(_IMPUTE_ROUNDS if censored.any() else 0):
        fit = predict(x, w)
        target = np.where(censored, np.maximum(y, fit), y)
        # a censored trial the fit puts under what it reached is a hard fact the fit must meet: weighed more
        w = solve(x, target, np.where(censored & (fit < y), _CENSORED_WEIGHT, 1.0))
    return w


def predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The fit of the rows ``x`` under the weights ``w``, never below 0."""
    fit: np.ndarray = np.maximum(x @ w, 0.0)
    return fit


def loo(x: np.ndarray, y: np.ndarray, censored: np.ndarray) -> np.ndarray:
    """The leave-one-out fit of the last ``SCORED`` observations (NaN where the rest hold no trial that ran
    to the end)."""
    out = []
    for i in range(max(0, len(y) - SCORED), len(y)):
        keep = np.arange(len(y)) != i
        ok = (~censored[keep]).any()
        out.append(float(predict(x[i : i + 1], fit_censored(x[keep], y[keep], censored[keep]))[0]) if ok else np.nan)
    return np.array(out)
