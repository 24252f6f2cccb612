"""Footprints learned from observed trials: peak RAM, VRAM and threads as a function of the params, with
an upper bound at a stated miss rate.

Owns the model (a non-negative least-squares fit over features that grow with each param, so the fit is
monotone in every param), censored observations ("at least this much") and the one error model. Knows
nothing of Optuna, storages or records: it is given plain observations. The features and the names that
say which params take memory: ``_features.py``; which params enter the fit (the evidence rule below):
``_evidence.py``.

The model, per resource: ``peak ~ w0 + sum_j w_j * u_j(x) [+ sum_{j<=k} w_jk * u_j * u_k]`` with every
``w >= 0`` and every ``u_j`` growing in the direction that takes memory (``x`` scaled to its observed range;
a log feature too where the param spans a decade or is declared log; one indicator per label). The fit
weighs each trial by ``1/peak`` (relative error); the additive and the product model are both fitted, the
one with the smaller leave-one-out error is used. With a footprint function the feature is that function's
own figure: ``peak ~ a + b * predicted`` (the correction of a recipe).

Evidence: a param enters the fit from the first trials when its name or type says it takes memory (a size
word, an int, a label), and leaves it when its effect across the trials seen is within the fit's noise
(the root mean square of the leave-one-out residuals); any other param (a rate, a coefficient, a seed, a
float of no known name) enters only where it lowers the leave-one-out error and its effect is beyond that
noise. A param the fit does not hold moves no prediction, so no clamp ever moves it.

One error model: each trial's leave-one-out residual, scaled by what varies, ``z = (peak - fit) / s`` with
``s = (fit - base) + NOISE * (base + level)`` (``base``: the fit's intercept, a process's constant baseline
such as TensorFlow's ~650 MiB, known well after a few trials; ``level``: for a trial's own increments in a
shared process, the usage they were measured from, median over the trials); the bound is ``fit + q * s``
with ``q`` Student's t quantile at ``1 - miss_rate`` of the scaled residuals' root mean square, pooled
with ``PRIOR_TRIALS`` trials of the prior ``PRIOR_Z``: wide while few trials are known, tighter with each.
A censored trial whose peak is over its leave-one-out fit counts with that residual (it missed by more).

The solver (``_nnls.py``, with the censored fit and its leave-one-out predictions) is SciPy's NNLS where the
program imported it, else a numpy active set (Lawson and Hanson; the core install has no SciPy): one answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from ..exceptions import EstimateError
from ._evidence import MIN_TURN, directed, evidence
from ._features import Encoder, Role, grows, is_number, number, role
from ._nnls import SCORED, fit_censored, loo, nnls, predict

__all__ = ["Learned", "Model", "Observation", "Role", "learned", "nnls", "role"]
RESOURCES = ("ram", "vram", "threads")
MISS_RATE = 0.1  # the default share of trials whose peak may exceed the bound
#: Trials observed before the bound is used, a stopped one included (at least 2); of them MIN_DONE ran to the end
#: (counting only those, LightGBM warmed up for 9 and 11), MIN_DONE_WHOLE for whole processes' peaks (bench_clients'
#: n_jobs=2 runs replayed: of 66 trials so predicted over the line, 44 were stopped or over it, 22 under it;
#: increments with one had bounds 10x theirs, 479 MiB for 48).
WARMUP, MIN_DONE, MIN_DONE_WHOLE = 4, 2, 1
#: The scale of a residual where the fit is at its base, as a share of the base: the run-to-run spread of a peak that
#: does not grow with the params, twice the larger seen in the recorded trials (tests/estimate/_recorded.py): Keras
#: trials at width 64-65 spread 0.1%, torch MLPs of width 80-126 and batch 512 or less 0.9% (309.9-312.8 MiB).
NOISE = 0.02
#: The prior of the scaled residuals' root mean square and its weight in trials: over all 39 recorded torch trials it
#: is 0.23 (from 4 trials, in five orders, it ranged 0.23 to 16): one trial's worth of 0.2.
PRIOR_Z, PRIOR_TRIALS = 0.2, 1


@dataclass(frozen=True)
class Observation:
    """One trial that ran: its params, its observed peaks (bytes; threads a count; ``None``: not read),
    whether the peaks are only lower bounds (``censored``: it was stopped, killed, ran out of memory, or was
    pruned before its peak settled), and, to correct a footprint function, that function's figures. Where
    the peaks are a trial's own increments in a shared process, ``start`` is the process's usage they were
    measured from: a reading's noise is a share of what the process holds, not of the increment."""

    params: Mapping[str, Any]
    peaks: Mapping[str, float | None]
    censored: bool = False
    predicted: Mapping[str, float | None] | None = None
    number: int | None = None
    start: Mapping[str, float | None] | None = None


def learned(
    *,
    miss_rate: float = MISS_RATE,
    warmup: int | None = None,
    monotone: Mapping[str, int] | None = None,
    categorical: Iterable[str] = (),
    log: Iterable[str] = (),
) -> Learned:
    """The settings of a learned footprint (what ``MemoryGuard(None, budget, learn=...)`` takes).

    Args:
        miss_rate: the share of trials whose peak may exceed the upper bound, in (0, 0.5].
        warmup: trials observed before the bound is used; default 4, at least 2. A trial stopped over the
            budget counts (what it reached is a lower bound); one must have run to the end (two in a shared
            process, where a trial's own increment is learned).
        monotone: ``{param: +1 or -1}``: memory grows with the param (+1) or shrinks (-1); a param declared
            here is in the fit from the first trials whatever its name.
        categorical: params whose values are labels even when they are numbers (one indicator each).
        log: params that also get a log-scale feature (a positive param spanning a decade gets one anyway).

    Examples:
        >>> model = learned(miss_rate=0.2).fit([
        ...     Observation({"n": n}, {"ram": 100 + 10 * n}) for n in (1, 4, 7, 10)])
        >>> model.ready, model.bound({"n": 20})["ram"] >= 300, model.directions["n"]
        (True, True, 1)
    """
    return Learned(miss_rate=miss_rate, warmup=warmup, monotone=monotone, categorical=categorical, log=log)


class Learned:
    """Checked settings of a learned footprint; ``fit`` turns observations into a ``Model``."""

    def __init__(
        self,
        *,
        miss_rate: float = MISS_RATE,
        warmup: int | None = None,
        monotone: Mapping[str, int] | None = None,
        categorical: Iterable[str] = (),
        log: Iterable[str] = (),
    ) -> None:
        if isinstance(miss_rate, bool) or not isinstance(miss_rate, (int, float)) or not 0 < miss_rate <= 0.5:
            raise EstimateError(f"miss_rate must be a share in (0, 0.5], but got {miss_rate!r}.")
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 2):
            raise EstimateError(
                f"warmup must be an int >= 2 (trials observed before the bound is used), but got {warmup!r}."
            )
        monotone = dict(monotone or {})
        for name, sign in monotone.items():
            if not isinstance(name, str) or sign not in (1, -1) or isinstance(sign, bool):
                raise EstimateError(
                    f"monotone[{name!r}] must be +1 (memory grows with the param) or -1 (it shrinks), but got {sign!r}."
                )
        for what, names in (("categorical", categorical), ("log", log)):
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise EstimateError(f"{what} must be a list of param names, but got {names!r}.")
        self.miss_rate = float(miss_rate)
        self.warmup = WARMUP if warmup is None else warmup
        self.monotone = monotone
        self.categorical = frozenset(categorical)
        self.log = frozenset(log)

    def __repr__(self) -> str:
        return f"learned(miss_rate={self.miss_rate:g}, warmup={self.warmup})"

    def fit(self, observations: Iterable[Observation], *, corrected: bool = False) -> Model:
        """The model of these observations. ``corrected``: learn ``peak ~ a + b * predicted`` from each
        observation's ``predicted`` figures (a footprint function's correction) instead of the params."""
        return Model(self, [o for o in observations if isinstance(o, Observation)], corrected)


@dataclass
class _Fit:
    """One resource's model: the encoder, the weights, the base, the usage increments were measured from
    (``level``, 0 for whole processes) and the quantile ``q`` over ``m`` scaled residuals (``_scale``)."""

    encoder: Encoder
    weights: np.ndarray
    level: float = 0.0
    base: float = 0.0
    q: float = 0.0
    m: int = 0


class Model:
    """Observations fitted: ``bound`` (the upper bound) and ``center`` (the fit) per resource. ``n``: those run
    to the end; ``ready``: ``warmup`` observed, ``min_done`` to the end (``MIN_DONE``, or ``MIN_DONE_WHOLE``)."""

    def __init__(self, settings: Learned, observations: list[Observation], corrected: bool) -> None:
        self.settings, self.corrected = settings, corrected
        self.observations = observations
        self.n = sum(not o.censored for o in observations)
        whole = not corrected and all(number((o.start or {}).get("ram")) is None for o in observations)
        self.min_done = MIN_DONE_WHOLE if whole else MIN_DONE
        self.ready = len(observations) >= settings.warmup and self.n >= self.min_done
        self._fits: dict[str, _Fit] = {}
        rows_all = [o for o in observations if o.predicted is not None] if corrected else observations
        for r in RESOURCES:
            rows = [
                o
                for o in rows_all
                if number(o.peaks.get(r)) is not None
                and (not corrected or number((o.predicted or {}).get(r)) is not None)
            ]
            if rows and max(float(o.peaks[r]) for o in rows) > 0:  # type: ignore[arg-type]
                self._fits[r] = self._fit(r, rows)
        ram = self._fits.get("ram")
        self.directions = {**({} if ram is None or corrected else ram.encoder.directions), **settings.monotone}
        self.roles = {} if ram is None else dict(ram.encoder.roles)
        self._kinds: dict[str, tuple[bool, int, bool]] = {}

    @property
    def miss_rate(self) -> float:
        return self.settings.miss_rate

    def _fit(self, resource: str, rows: list[Observation]) -> _Fit:
        y = np.array([float(o.peaks[resource]) for o in rows])  # type: ignore[arg-type]
        censored = np.array([o.censored for o in rows])
        if self.corrected:
            enc = Encoder.corrected(resource, rows)
            x = enc.matrix(rows)
            # before the warm-up: the function's figures as they are (their residuals price the bound)
            w = fit_censored(x, y, censored) if self.ready else np.array([0.0, enc.scale])
            return self._errors(resource, _Fit(enc, w), x, y, censored)
        starts = [float(v) for o in rows if (v := number((o.start or {}).get(resource))) is not None]
        level = float(np.median(starts)) if starts else 0.0
        full = Encoder.of(self.settings, rows, y)
        prior = [
            n
            for n in full.params
            if full.roles[n] is not Role.NONE
            and (n in full.labels or full.roles[n] is Role.SIZE)
            or n in self.settings.monotone
        ]
        best: tuple[float, Encoder, np.ndarray] | None = None
        for products in (False, True) if full.numeric else (False,):
            enc = directed(full.only(prior, products), self.settings.monotone, rows, y, censored)
            # any other param only from MIN_TURN trials on: with fewer, one that varies alongside a size by chance
            # (a learning rate drawn high where the width was) lowers the error as well as the size does
            late = [n for n in full.params if n not in prior] if len(rows) >= MIN_TURN else []
            enc, err, x = evidence(enc, full, late, rows, y, censored)
            if best is None or err < best[0]:
                best = (err, enc, x)
        assert best is not None
        _, enc, x = best
        return self._errors(resource, _Fit(enc, fit_censored(x, y, censored), level), x, y, censored)

    def _errors(self, resource: str, fit: _Fit, x: np.ndarray, y: np.ndarray, censored: np.ndarray) -> _Fit:
        """The fit's base and the bound's quantile from its leave-one-out residuals (see the module)."""
        fit.base = max(min(float(fit.weights[0]), float(predict(x, fit.weights).min())), 0.0)
        if self.corrected and not self.ready:  # the function's own figures: each residual is out of sample
            preds = predict(x, fit.weights)[-SCORED:]
        else:
            preds = loo(x, y, censored, fit.weights) if len(y) > 1 else np.full(len(y), np.nan)
        z = [
            (yy - p) / max(_scale(resource, p, fit.base, fit.level), 1.0)  # at least a byte, a thread
            for yy, p, c in zip(y[-len(preds) :], preds, censored[-len(preds) :], strict=False)
            if math.isfinite(p) and (not c or yy > p)
        ]
        fit.m = len(z)
        rms = math.sqrt((PRIOR_TRIALS * PRIOR_Z**2 + sum(v * v for v in z)) / (PRIOR_TRIALS + fit.m))
        fit.q = _t_quantile(1 - self.settings.miss_rate, PRIOR_TRIALS + fit.m) * rms
        return fit

    def center(self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None) -> dict[str, int]:
        """The fitted peak of ``params`` per resource (0 for a resource never observed)."""
        return {r: self._value(r, params, predicted, upper=False) for r in RESOURCES}

    def bound(self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None) -> dict[str, int]:
        """The upper bound of ``params``'s peak per resource, missed by about ``miss_rate`` of trials (0 for a resource
        never observed). Never below what a censored trial whose params this assignment dominates reached, nor above
        what a trial run to the end that covers it took (``ceiling``: memory is monotone in each param)."""
        floor, ceiling = self.floor(params), self.ceiling(params)
        out = {r: self._value(r, params, predicted, upper=True) for r in RESOURCES}
        return {r: max(min(v, ceiling.get(r, v)), floor.get(r, 0)) for r, v in out.items()}

    def floor(self, params: Mapping[str, Any]) -> dict[str, int]:
        """What a censored trial whose params ``params`` dominate (each param that takes memory at least as large in its
        memory direction, +1 until one is learned or declared; the same label for the rest; a param of role ``none``
        or ``other`` passed over unless declared in ``monotone``) reached, per resource: the least this assignment
        needs."""
        out: dict[str, int] = {}
        for o in self.observations:
            if o.censored and self._dominates(params, o.params):
                for r, v in o.peaks.items():
                    if v is not None:
                        out[r] = max(out.get(r, 0), int(v))
        return out

    def ceiling(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The least peak, plus a reading's noise, of the trials run to the end whose params cover ``params``
        (``below``): memory is monotone. Without it a width seen once, at another learning rate, had a bound 5.8
        times its peak, and GPT-2s (420 MiB of imports, tens their own) one bound for all (no param held)."""
        out = dict[str, int]()
        for o in () if self.corrected else self.observations:
            if o.censored or self.below(params, o.params) is None:
                continue
            for r, v in o.peaks.items():
                fit = self._fits.get(r)
                if v is not None and fit is not None:
                    cap = int(math.ceil(float(v) + _scale(r, fit.base, fit.base, fit.level)))
                    out[r] = min(out.get(r, cap), cap)
        return out

    def below(self, params: Mapping[str, Any], theirs: Mapping[str, Any], *, together: bool = False) -> set[str] | None:
        """The params in which ``params`` take less memory than ``theirs`` where ``theirs`` cover them (else None): the
        same names, each param the fit holds, monotone or named as growing at least as large in its memory direction,
        other sizes and labels equal, rates passed over; ``together``: instead, their (positive) product smaller."""
        if theirs.keys() != params.keys():
            return None
        smaller, ratio = set(), 1.0
        for name, mine in params.items():
            other, (directed, sign, equal) = theirs[name], self._kind(name)
            if directed and is_number(mine) and is_number(other):  # a direction the fit does not hold: the name's
                gap = sign * (float(other) - float(mine))
                if (together and min(float(mine), float(other)) <= 0) or (gap < 0 and not together):
                    return None
                if gap > 0:
                    smaller.add(name)
                ratio *= (float(mine) / float(other)) ** sign if together else 1.0
            elif equal and mine != other:  # no direction shown: equal
                return None
        return smaller if ratio < 1 or not together else None

    def _kind(self, name: str) -> tuple[bool, int, bool]:
        """``below``'s view of a param (asked per trial run to the end, per bound): whether it has a direction (held
        by the fit, declared or named as growing; not declared categorical), which, and whether else equal."""
        if name not in self._kinds:
            known = name in self.params("ram") or name in self.settings.monotone
            directed = name not in self.settings.categorical and (known or grows(name))
            sign = self.directions.get(name, 1) if known else 1
            self._kinds[name] = (directed, sign, known or self.roles.get(name) is Role.SIZE)
        return self._kinds[name]

    def dominated_by(self, params: Mapping[str, Any]) -> int | None:
        """The number of a censored trial ``params`` dominate (see ``floor``), if any."""
        return next((o.number for o in self.observations if o.censored and self._dominates(params, o.params)), None)

    def unseen(self, params: Mapping[str, Any]) -> list[str]:
        """The params of RAM's fit for which ``params`` is beyond every observed trial's value in the
        direction that takes less memory: there the fit holds the low end seen, the bound is no calibrated
        one (every param of the fit moves it beyond its noise)."""
        fit = self._fits.get("ram")
        out = []
        for name, (lo, hi, direction, _) in ({} if fit is None else fit.encoder.numeric).items():
            value = number(params.get(name))
            if value is not None and (value < lo if direction > 0 else value > hi):
                out.append(name)
        return out

    def params(self, resource: str = "ram") -> list[str]:
        """The params the fit of ``resource`` holds: the only ones that move its prediction."""
        fit = self._fits.get(resource)
        return [] if fit is None else fit.encoder.params

    def quantile(self, resource: str) -> tuple[float, int, float, float] | None:
        """The bound's quantile ``q``, the scaled residuals it pools, the base and the level (bytes): bound =
        fit + q x (fit above base + NOISE x (base + level)). ``None``: the resource was never observed."""
        fit = self._fits.get(resource)
        return None if fit is None else (fit.q, fit.m, fit.base, fit.level)

    def _value(self, r: str, params: Mapping[str, Any], predicted: Mapping[str, float] | None, upper: bool) -> int:
        fit = self._fits.get(r)
        if fit is None:  # a footprint function's figure before any trial: the prior's quantile on it
            value = float((predicted or {}).get(r) or 0) if self.corrected else 0.0
            return int(math.ceil(value * (1 + _prior_q(self.miss_rate)) if upper else value))
        value = max(float(fit.encoder.row(params, predicted, fit.weights) @ fit.weights), 0.0)
        if upper:
            value += fit.q * _scale(r, value, fit.base, fit.level)
        return int(math.ceil(round(value, 6))) if upper else int(round(value))  # 5.0000001 threads is 5

    def _dominates(self, params: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
        if not other or set(other) - set(params):
            return False
        for name, value in other.items():
            mine = params[name]
            if (
                name not in self.settings.monotone
                and self.roles.get(name, Role.SIZE) is not Role.SIZE
                and is_number(mine)
                and is_number(value)
            ):
                continue  # a rate, a coefficient, a float of no known name: no size
            if name not in self.settings.categorical and is_number(mine) and is_number(value):
                if self.directions.get(name, 1) * (float(mine) - float(value)) < 0:
                    return False
            elif mine != value:
                return False
        return True


def _scale(resource: str, fit: float, base: float, level: float = 0.0) -> float:
    """What a residual is measured in: the fit above its base plus NOISE x what the process holds at the
    base (``level``: its usage an increment was measured from). A thread count has no run-to-run noise: the
    fit above its base alone. Scaled by the increment's base alone (a few MiB in a 300 MiB process), a
    1 MiB spread was 20 noises: a grid of 1-48 MiB increments got a 929 MiB bound at 32 (a 32 MiB fit)."""
    return max(fit - base, 0.0) + (0.0 if resource == "threads" else NOISE * (base + level))


def _prior_q(miss_rate: float) -> float:
    return _t_quantile(1 - miss_rate, PRIOR_TRIALS) * PRIOR_Z


def _t_quantile(p: float, df: float) -> float:
    """Student's t quantile (Cornish-Fisher series, Abramowitz and Stegun 26.7.5: within 2% of the exact
    value from 2 degrees of freedom on, 3.012 for 3.078 at 1 and p = 0.9)."""
    z = NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * df**4)
    )
