"""The clamp search: the nearest assignment that fits, found by lowering params one at a time.

Owns the search over Optuna distributions (grids, log scales, categorical choices) and which params it
never moves (a learning rate, a coefficient, a seed: ``estimate.learn.role`` says so by the name); knows
nothing of budgets, trials or records: it is given the footprint function, the excess over the line and
the line. A learned footprint moves only with the params its fit holds (those whose effect is beyond the
fit's noise), so a param without that evidence removes no excess and is never ranked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from ..estimate.learn import Role, role

if TYPE_CHECKING:
    from ..estimate.footprint import Footprint

_BISECT_STEPS = 24  # continuous params: bisection steps on the (log) scale ...
_BISECT_TOL = 1e-4  # ... or until the interval is this fraction of the param's range


class ClampSearch:
    """Lowers params of an assignment until its footprint fits under the line.

    Assumes the footprint does not grow when a param is lowered.

    Args:
        predict: ``params -> Footprint`` (best cached: a search evaluates tens of assignments).
        excess: ``Footprint -> {resource: amount over the line}``, empty when it fits.
        limits: the line per budgeted resource, which ``excess`` measures against.

    Examples:
        >>> import optuna_memprune as omp
        >>> from optuna.distributions import IntDistribution
        >>> search = ClampSearch(lambda p: omp.Footprint.of(ram=p["n"]),
        ...                      lambda f: {"ram": f.ram - 100} if f.ram > 100 else {}, {"ram": 100})
        >>> search.clamp({"n": 500}, {"n": IntDistribution(1, 1000)}, ["n"], omp.Footprint.of(ram=500))[0]
        {'n': 100}
    """

    def __init__(
        self,
        predict: Callable[[dict[str, Any]], Footprint],
        excess: Callable[[Footprint], dict[str, int]],
        limits: Mapping[str, int],
    ) -> None:
        self._predict = predict
        self._excess = excess
        self._limits = dict(limits)

    def clamp(
        self,
        assignment: dict[str, Any],
        space: dict[str, BaseDistribution],
        names: list[str],
        footprint: Footprint,
    ) -> tuple[dict[str, Any], Footprint] | None:
        """The nearest assignment that fits, lowering ``names`` only; ``None`` when none fits.

        Params are lowered one at a time, the one whose lowering removes the most excess per unit of its
        (log-)range first; each goes to the highest value that fits, or to its lowest when none does. A param
        whose name says it takes no memory (``learning_rate``, ``gamma``, ``dropout``, ``seed``...) is never
        lowered, even where the footprint moves with it.
        """
        base_excess = self._excess_score(footprint)
        ranked = []
        for name in names:
            if role(name) is Role.NONE:
                continue
            lowest = self._lowest(assignment, name, space[name])
            if lowest is None:
                continue
            gain = base_excess - self._excess_score(self._predict({**assignment, name: lowest}))
            if gain > 0:
                ranked.append((gain / _distance(space[name], assignment[name], lowest), name))
        ranked.sort(key=lambda item: -item[0])
        current = dict(assignment)
        for _, name in ranked:
            value, footprint, fits = self.lower_one(current, name, space[name])
            current[name] = value
            if fits:
                return current, footprint
        return None

    def lower_one(self, assignment: dict[str, Any], name: str, dist: BaseDistribution) -> tuple[Any, Footprint, bool]:
        """The highest value of ``name`` at or below its current one that fits (and its footprint, True),
        or its lowest-footprint value (and False)."""
        current = assignment[name]

        def fp(value: Any) -> Footprint:
            return self._predict({**assignment, name: value})

        if isinstance(dist, CategoricalDistribution):
            for value in self._lower_choices(assignment, name, dist):
                footprint = fp(value)
                if not self._excess(footprint):
                    return value, footprint, True
            lowest = self._lowest(assignment, name, dist)
            value = current if lowest is None else lowest
            return value, fp(value), False

        assert isinstance(dist, (IntDistribution, FloatDistribution))
        grid = _grid(dist, current)
        if grid is not None:  # ints and stepped floats: bisection over the grid indices below the value
            low_fp = fp(grid(0))
            if self._excess(low_fp):
                return grid(0), low_fp, False
            lo, hi = 0, _grid_index(dist, current)
            lo_fp = low_fp
            while hi - lo > 1:
                mid = (lo + hi) // 2
                mid_fp = fp(grid(mid))
                if self._excess(mid_fp):
                    hi = mid
                else:
                    lo, lo_fp = mid, mid_fp
            return grid(lo), lo_fp, True
        # continuous floats: bisection on the param's own scale (log when log=True)
        to_t, from_t = (math.log, math.exp) if dist.log else (float, float)
        low_fp = fp(float(dist.low))
        if self._excess(low_fp):
            return float(dist.low), low_fp, False
        t_lo, t_hi = to_t(dist.low), to_t(current)
        best, best_fp = float(dist.low), low_fp
        tol = _BISECT_TOL * (to_t(dist.high) - to_t(dist.low))
        for _ in range(_BISECT_STEPS):
            if t_hi - t_lo <= tol:
                break
            t_mid = (t_lo + t_hi) / 2
            value = min(max(from_t(t_mid), float(dist.low)), float(current))
            mid_fp = fp(value)
            if self._excess(mid_fp):
                t_hi = t_mid
            else:
                t_lo, best, best_fp = t_mid, value, mid_fp
        return best, best_fp, True

    def _lowest(self, assignment: dict[str, Any], name: str, dist: BaseDistribution) -> Any | None:
        """The value of ``name`` with the lowest footprint below the current one; ``None`` if there is none."""
        current = assignment[name]
        if isinstance(dist, CategoricalDistribution):
            lower = self._lower_choices(assignment, name, dist)
            return lower[-1] if lower else None
        if isinstance(dist, (IntDistribution, FloatDistribution)):
            if not current > dist.low:
                return None
            return int(dist.low) if isinstance(dist, IntDistribution) else float(dist.low)
        return None

    def _lower_choices(self, assignment: dict[str, Any], name: str, dist: CategoricalDistribution) -> list[Any]:
        """The choices 'below' the current one, nearest first: numerically smaller ones when the choices are
        numbers, otherwise the choices with a lower footprint, highest footprint first."""
        current = assignment[name]
        choices = list(dist.choices)
        if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
            return sorted((c for c in choices if c < current), reverse=True)
        load = {i: self._load(self._predict({**assignment, name: c})) for i, c in enumerate(choices)}
        here = self._load(self._predict(assignment))
        lower = [i for i in load if load[i] < here and choices[i] != current]
        return [choices[i] for i in sorted(lower, key=lambda i: -load[i])]

    def _excess_score(self, footprint: Footprint) -> float:
        return sum(over / max(self._limits[r], 1) for r, over in self._excess(footprint).items())

    def _load(self, footprint: Footprint) -> float:
        load: float = 0
        for r, limit in self._limits.items():
            used: int = getattr(footprint, r)
            load += used / max(limit, 1)
        return load


def _grid(dist: IntDistribution | FloatDistribution, current: Any) -> Callable[[int], float] | None:
    """Index -> value over the grid of an int or stepped float param; ``None`` for continuous floats."""
    if isinstance(dist, IntDistribution):
        return lambda k: int(dist.low + k * dist.step)
    step = dist.step
    if step is not None:
        return lambda k: float(min(dist.low + k * step, dist.high))
    return None


def _grid_index(dist: IntDistribution | FloatDistribution, value: Any) -> int:
    return int(math.floor((value - dist.low) / dist.step + 1e-9))


def _distance(dist: BaseDistribution, current: Any, lowest: Any) -> float:
    """How far ``lowest`` is below ``current`` as a fraction of the param's (log-)range."""
    if isinstance(dist, (IntDistribution, FloatDistribution)) and dist.high > dist.low:
        t = math.log if dist.log else float
        return max((t(current) - t(lowest)) / (t(dist.high) - t(dist.low)), 1e-12)
    return 1.0
