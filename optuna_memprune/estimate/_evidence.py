"""Which params the learned fit holds (``learn.py``): the evidence rule, each param kept only while its effect is
beyond the fit's leave-one-out noise, and the direction of a param the data show takes memory as it falls.

Knows nothing of Optuna or the error model: the trials (``learn.Observation``), their peaks and the encoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._features import Encoder
from ._nnls import fit_censored, loo, predict

#: Trials observed before a param's direction may be turned to "memory falls as it grows": with fewer, a
#: param that merely varies alongside one that takes memory (confounded) looks like it.
MIN_TURN = 20


def evidence(
    enc: Encoder, full: Encoder, candidates: list[str], rows: list[Any], y: np.ndarray, censored: np.ndarray
) -> tuple[Encoder, float, np.ndarray]:
    """``enc`` with each candidate added where it lowers the leave-one-out error and moves the fit beyond
    its noise, then each param whose effect is within the noise removed, weakest first. Returns the
    encoder, its leave-one-out error (mean relative) and its matrix."""

    def score(e: Encoder) -> tuple[float, float, np.ndarray, dict[str, float]]:
        x = e.matrix(rows)
        preds = loo(x, y, censored, fitted := fit_censored(x, y, censored))  # each fit left one out starts from it
        done = ~censored[-len(preds) :] & np.isfinite(preds)
        yd = y[-len(preds) :][done]
        resid = yd - preds[done]
        noise = float(np.sqrt(np.mean(resid**2))) if len(resid) else 0.0
        # a trial's own increment may be 0 (its process held what it needed): errors relative to at least 1%
        # of the largest peak, never a division by 0 (inf or nan, which no comparison below can rank)
        err = float(np.mean(np.abs(resid) / np.maximum(yd, 0.01 * float(y.max())))) if len(resid) else math.inf
        return err, noise, x, e.effects(x, fitted)

    err, noise, x, effects = score(enc)
    for name in candidates:
        other = enc.plus(full, name)
        e2, n2, x2, eff2 = score(other)
        if e2 < err and eff2.get(name, 0.0) > n2:
            enc, err, noise, x, effects = other, e2, n2, x2, eff2
    while effects:
        weakest = min(effects, key=effects.__getitem__)
        if effects[weakest] > noise:
            break
        other = enc.only([n for n in enc.params if n != weakest])
        e2, n2, x2, eff2 = score(other)
        if e2 > err and effects[weakest] > 0:  # within the noise, but the trials are predicted better with it
            break
        enc, err, noise, x, effects = other, e2, n2, x2, eff2
    return enc, err, x


def directed(
    enc: Encoder, monotone: Mapping[str, int], rows: list[Any], y: np.ndarray, censored: np.ndarray
) -> Encoder:
    """``enc`` with each undeclared param's direction flipped where that fits the trials clearly better
    (a marginal rank correlation is confounded by the other params: a param that lowers memory can look
    neutral); only from ``MIN_TURN`` trials on."""
    if len(rows) < MIN_TURN:
        return enc

    def error(e: Encoder) -> float:
        x = e.matrix(rows)
        done = ~censored
        floor = np.maximum(y[done], 0.01 * float(y.max()))  # an increment may be 0: as in ``_evidence``
        return float(np.mean(np.abs(predict(x, fit_censored(x, y, censored))[done] - y[done]) / floor))

    best = error(enc)
    for name in [n for n in enc.numeric if n not in monotone]:
        other = enc.flipped(name)
        err = error(other)
        if err < 0.8 * best:  # a clear improvement only: one noisy peak must not turn a param around
            enc, best = other, err
    return enc
