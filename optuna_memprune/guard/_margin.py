"""The learned margin: the factor a runner's host reservation puts on top of a prediction.

Pure arithmetic over (observed, predicted) pairs; knows nothing of Optuna, storages or where the pairs
came from (the runner reads them from the study's trial records).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_MARGIN = 1.25  # before any evidence: a quarter on top of the prediction
QUANTILE = 0.95  # the share of observed trials a learned margin covers
MIN_SAMPLES = 5  # below this many observations the margin never drops under DEFAULT_MARGIN


def margin(
    pairs: Iterable[tuple[float, float]],
    *,
    default: float = DEFAULT_MARGIN,
    quantile: float = QUANTILE,
    min_samples: int = MIN_SAMPLES,
) -> float:
    """The factor to put on a prediction so that it covers ``quantile`` of the observed peaks.

    ``pairs`` are ``(observed, predicted)`` peaks of trials that ran to the end; pairs with a predicted
    figure <= 0 or a non-finite one are ignored. The margin is the ``quantile`` of the ratios
    observed / predicted (linear interpolation), never below 1.0. With fewer than ``min_samples`` ratios
    it is the larger of ``default`` and the largest ratio seen, so a reservation starts safe and
    tightens only as evidence accumulates; a ratio above ``default`` raises it at once.

    Examples:
        >>> margin([(1.1, 1.0)] * 2), round(margin([(1.02, 1.0)] * 9 + [(0.9, 1.0)]), 3)
        (1.25, 1.02)
    """
    if not default >= 1.0:
        raise ValueError(f"default must be a factor >= 1.0, but got {default!r}.")
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], but got {quantile!r}.")
    ratios = sorted(o / p for o, p in pairs if p > 0 and math.isfinite(o) and math.isfinite(p) and o >= 0)
    if len(ratios) < min_samples:
        return max([default, *ratios])
    pos = quantile * (len(ratios) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ratios) - 1)
    value = ratios[lo] + (ratios[hi] - ratios[lo]) * (pos - lo)
    return max(1.0, value)
