"""RSS projected to a run's last step from its readings and the steps it reached: a Theil-Sen fit with Sen's bound.

Owns the fit and the rules that keep a plateau from being called growth; knows nothing of Optuna or budgets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

from ..units import check_int, check_number

#: The fit looks at the last half of the steps observed so far: an allocation made at the start (imports,
#: a warm-up, a ring buffer that filled early) is outside it once the run has gone twice as far.
WINDOW = 0.5
#: No forecast before this share of the run: a ring buffer that fills in the first twentieth of a run is
#: flat over the whole window by then.
MIN_PROGRESS = 0.1
#: One-sided confidence of the slope's lower bound (Sen's interval from Kendall's tau).
CONFIDENCE = 0.99
#: Both halves of the window must grow, each (its median slope) at least this share of the whole window's
#: slope: a curve that slows down (a buffer about to be full) or a step (a warm-up allocation) is not a line.
CONSISTENT = 0.5
#: The window is cut into this many spans of equal steps, each summed up by its medians: the slope's lower
#: bound comes from them, since readings next to each other are not independent (a buffer being sampled, a
#: collector's cycle), which makes an interval over single readings far too narrow.
BINS = 8
#: Spans that may have no reading (a monitor thread starved on a loaded machine misses a few readings).
EMPTY = 2
#: Of the ``BINS - 1`` moves from one span to the next, at most this many may fall: growth is sustained, a
#: noisy or cycling level rises about half the time.
FALLS = 1
_MIN_POINTS = 12  # readings in the window
_FIT_POINTS = 48  # readings the fit uses at most (evenly spaced): 1,128 pairs


class Forecast(NamedTuple):
    """A projection of RSS to the last step. Bytes are ints; ``slope*`` are bytes per step.

    Attributes:
        step: The step reached (the last one reported).
        horizon: The last step of the run.
        level: The fitted RSS at ``step``.
        slope, slope_low: Theil-Sen's slope over the window and its lower confidence bound.
        projected, projected_low: RSS at ``horizon`` with ``slope`` and with ``slope_low``.
        over: Whether the run will cross ``limit`` with high confidence: ``projected_low`` over the limit
            (times ``1 + margin``) and every plateau rule passed.
        held: Empty when ``over``; otherwise why not, in words.
        first: The first step of the window the fit used.
    """

    step: int
    horizon: int
    level: int
    slope: float
    slope_low: float
    projected: int
    projected_low: int
    over: bool
    held: str
    first: int

    def at(self, step: float) -> int:
        """The projected RSS at ``step`` (with the fitted slope)."""
        return int(self.level + self.slope * (step - self.step))


def steps_of(points: Sequence[tuple[float, int]], marks: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """``(step, rss)`` of the readings ``(t, rss)`` taken between the first and the last step mark ``(t,
    step)``, each reading's step interpolated linearly in time between the marks around it.

    Examples:
        >>> steps_of([(0.5, 10), (1.5, 20), (3.0, 30)], [(0.0, 0), (2.0, 100)])
        [(25.0, 10), (75.0, 20)]
    """
    marks = sorted(marks)
    if len(marks) < 2:
        return []
    out = []
    j = 0
    for t, rss in sorted(points):
        if t < marks[0][0] or t > marks[-1][0]:
            continue
        while marks[j + 1][0] < t:
            j += 1
        (t0, s0), (t1, s1) = marks[j], marks[j + 1]
        out.append((s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else float(s1), rss))
    return out


def _theil_sen(xy: Sequence[tuple[float, float]], z: float) -> tuple[float, float]:
    """Median slope and its lower bound (Sen 1968: the pairwise slope of rank (N - C) / 2)."""
    slopes = sorted((y1 - y0) / (x1 - x0) for i, (x0, y0) in enumerate(xy) for x1, y1 in xy[i + 1 :] if x1 > x0)
    if not slopes:
        return 0.0, 0.0
    n, m = len(xy), len(slopes)
    spread = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = slopes[max(0, min(m - 1, int((m - spread) / 2)))]
    mid = slopes[m // 2] if m % 2 else (slopes[m // 2 - 1] + slopes[m // 2]) / 2
    return mid, low


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def forecast(
    points: Sequence[tuple[float, int]],
    marks: Sequence[tuple[float, int]],
    horizon: int,
    limit: int,
    *,
    margin: float = 0.0,
    min_progress: float = MIN_PROGRESS,
    confidence: float = CONFIDENCE,
) -> Forecast | None:
    """Project RSS to step ``horizon`` and say whether it will cross ``limit`` with high confidence.

    ``points`` are readings ``(t, rss)``, ``marks`` the steps reached ``(t, step)`` (any clock, the same for
    both). Readings are placed on the step axis (``steps_of``); the fit is Theil-Sen over the readings
    of the last ``WINDOW`` of the steps observed, with Sen's lower bound on the slope at ``confidence``. The
    run is called over only when all hold: at least ``min_progress`` of the run observed; the slope's lower
    bound positive (from the medians of ``BINS`` spans of the window); the RSS rising from span to span,
    with at most ``FALLS`` falls; each half of the window growing at least ``CONSISTENT`` of the window's
    slope (no step, no slowing down); and ``projected_low`` over ``limit x (1 + margin)``.

    Known limit: a buffer still filling at a steady rate when the forecast looks (past ``min_progress``) is
    growth as far as any fit can tell; if that rate, kept up to ``horizon``, crosses the limit, the run is
    called over even when the buffer would have filled (plateaued) in time. A buffer that fills in the first
    ``min_progress x WINDOW`` of the run (a twentieth by default) is flat over the whole window when the
    forecast first looks.

    Returns ``None`` while there is nothing to fit (fewer than two marks, the horizon reached or passed, too
    few readings in the window).

    Examples:
        >>> marks = [(t, 1000 * t) for t in range(21)]                # 1,000 steps a second
        >>> points = [(t / 10, 100 + 5 * t) for t in range(201)]       # +50 bytes a second, so 0.05 per step
        >>> f = forecast(points, marks, horizon=100_000, limit=4_000)
        >>> f.over, f.step, f.projected
        (True, 20000, 5100)
        >>> forecast(points, marks, horizon=100_000, limit=6_000).over
        False
    """
    check_int(horizon, "horizon", minimum=1)
    check_int(limit, "limit", minimum=0)
    check_number(margin, "margin", minimum=0)
    check_number(min_progress, "min_progress", minimum=0, maximum=1)
    check_number(confidence, "confidence", minimum=0.5, maximum=1, open_max=True)
    xy = steps_of(points, marks)
    step = int(max(s for _, s in marks)) if marks else 0
    if not xy or step >= horizon:
        return None
    first_mark = min(s for _, s in marks)
    lo = step - WINDOW * (step - first_mark)
    window = [p for p in xy if p[0] >= lo]
    if len(window) < _MIN_POINTS:
        return None
    stride = max(1, math.ceil(len(window) / _FIT_POINTS))
    window = window[::-1][::stride][::-1]  # evenly spaced, the latest reading kept
    z = NormalDist().inv_cdf(confidence)
    slope, _ = _theil_sen(window, 0.0)
    bins = _bins(window)
    slope_low = _theil_sen(bins, z)[1] if len(bins) >= BINS - EMPTY else 0.0
    level = _median([y - slope * x for x, y in window]) + slope * step
    left = horizon - step
    projected, projected_low = int(level + slope * left), int(level + min(slope_low, slope) * left)
    held = _held(bins, slope, slope_low, step / horizon, min_progress)
    if not held and projected_low <= limit * (1 + margin):
        held = "the lower bound of the projection is within the limit"
    return Forecast(
        step=step,
        horizon=horizon,
        level=int(level),
        slope=slope,
        slope_low=slope_low,
        projected=projected,
        projected_low=projected_low,
        over=not held,
        held=held,
        first=int(window[0][0]),
    )


def _bins(window: list[tuple[float, int]]) -> list[tuple[float, float]]:
    """The window cut into ``BINS`` spans of equal steps, each as the median step and RSS of its readings;
    fewer when a span has no reading."""
    x0, x1 = window[0][0], window[-1][0]
    width = (x1 - x0) / BINS or 1.0
    groups: list[list[tuple[float, int]]] = [[] for _ in range(BINS)]
    for x, y in window:
        groups[min(int((x - x0) / width), BINS - 1)].append((x, y))
    return [(_median([x for x, _ in g]), _median([y for _, y in g])) for g in groups if g]


def _held(bins: list[tuple[float, float]], slope: float, slope_low: float, progress: float, min_progress: float) -> str:
    """Why the window is not confident growth, or ``""``."""
    if progress < min_progress:
        return f"only {progress:.1%} of the run observed (at least {min_progress:.0%} needed)"
    if len(bins) < BINS - EMPTY:
        return f"parts of the window have no reading (only {len(bins)} of {BINS} spans have one)"
    if slope_low <= 0:
        return "the slope's lower bound is not positive (flat or noisy)"
    rises = sum(b[1] > a[1] for a, b in zip(bins, bins[1:], strict=False))
    if rises < len(bins) - 1 - FALLS:
        return f"the RSS rose in only {rises} of {len(bins) - 1} spans of the window (noise, a step or a cycle)"
    half = len(bins) // 2
    for name, part in (("older", bins[:half]), ("recent", bins[half:])):
        h_slope, _ = _theil_sen(part, 0.0)
        if h_slope < CONSISTENT * slope:
            return (
                f"the {name} half of the window does not grow like the whole (a plateau or a step: "
                f"{h_slope:.0f} against {slope:.0f} bytes a step)"
            )
    return ""
