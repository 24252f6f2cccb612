"""Footprints learned from observed trials: peak RAM, VRAM and threads as a function of the params, with
an upper bound at a stated miss rate.

Owns the model (a non-negative least-squares fit over features that grow with each param, so the fit is
monotone in every param), the direction of each param (declared, or read from the data), censored
observations ("at least this much"), and the conformal upper bound. Knows nothing of Optuna, storages or
records: it is given plain observations.

The model, per resource: ``peak ~ w0 + sum_j w_j * u_j(x) + sum_{j<=k} w_jk * u_j * u_k`` with every
``w >= 0`` and every ``u_j`` growing in the direction that takes memory (``x`` scaled to its observed range;
a log feature too where the param spans a decade or is declared log; one indicator per categorical
choice). The fit weighs each trial by ``1/peak`` (relative error). The additive and the product model are
both fitted; the one with the smaller leave-one-out error is used. With a footprint function the only
feature is that function's own figure: ``peak ~ a + b * predicted`` (the correction of a recipe).

The bound is split-conformal in its jackknife form: each observation's score is its peak over the
prediction of the model fitted without it; the bound is the prediction times the ``ceil((n+1)(1-miss))``-th
smallest of the ``n`` scores, and at least ``MIN_FACTOR`` (1/0.95) for RAM and VRAM. That order statistic
exists only once ``n >= (1-miss)/miss`` (9 at the default 10%): the warm-up is exactly the number of
trials below which no bound at that miss rate exists. The same order statistic of the absolute scores
(peak minus the leave-one-out fit) gives a second conformal bound, fit plus that residual, whose least
is ``MIN_FACTOR`` on the part of the fit above its intercept (a constant baseline, such as TensorFlow's
~800 MiB, is known well after a few trials; a factor on it would put a trial just above the baseline over
a soft line it stays under). Each fit uses one of the two scores, the one whose bounds over its own
trials are the tighter (a choice of score family, made like the choice of model; the miss rate is the
chosen score's). A footprint function's correction keeps the ratio score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .checks import EstimateError

RESOURCES = ("ram", "vram", "threads")
MISS_RATE = 0.1        # the default share of trials whose peak may exceed the bound
MIN_WARMUP = 4         # never fewer observed trials than this, whatever the miss rate
SCORED = 60            # the most recent observations scored by leave-one-out (older ones are fitted only)
_IMPUTE_ROUNDS = 3     # censored targets raised to the fit this many times
#: Trials observed before a param's direction may be turned to "memory falls as it grows": with fewer, a
#: param that merely varies alongside one that takes memory (confounded) looks like it.
MIN_TURN = 20
_CENSORED_WEIGHT = 10.0  # the weight of a censored trial the fit puts below what it reached
_DECADE = 10.0         # a positive numeric param spanning this ratio also gets a log feature
#: The least the bound puts on the fit (RAM, VRAM): a trial clamped or admitted right under the soft line
#: crosses it only when its peak is at least 5% over the fit, (peak - fit) / peak >= 0.05. With a dozen
#: trials the conformal factor is their largest leave-one-out ratio, which under-states the tail.
MIN_FACTOR = 1 / 0.95
#: The scaled residual's noise where the fit is at its base, as a share of the base: the run-to-run spread
#: allowed for a peak that does not grow with the params (a process's baseline, a library's import)
NOISE = 0.02


@dataclass(frozen=True)
class Observation:
    """One trial that ran: its params, its observed peaks (bytes; threads a count; ``None``: not read),
    whether the peaks are only lower bounds (``censored``: it was stopped, soft-pruned, killed or ran out
    of memory), and, to correct a footprint function, that function's figures for the same params."""

    params: Mapping[str, Any]
    peaks: Mapping[str, float | None]
    censored: bool = False
    predicted: Mapping[str, float | None] | None = None
    number: int | None = None


def learned(
    *,
    miss_rate: float = MISS_RATE,
    warmup: int | None = None,
    monotone: Mapping[str, int] | None = None,
    categorical: Iterable[str] = (),
    log: Iterable[str] = (),
) -> "Learned":
    """The settings of a learned footprint (what ``MemoryGuard(None, budget, learn=...)`` takes).

    Args:
        miss_rate: the share of trials whose peak may exceed the upper bound, in (0, 0.5].
        warmup: trials observed to the end before the bound is used; default and minimum
            ``max(4, ceil((1 - miss_rate) / miss_rate))`` (9 at 10%), the fewest that give a finite bound.
        monotone: ``{param: +1 or -1}``: memory grows with the param (+1) or shrinks (-1); other params'
            directions are read from the data (the sign of their rank correlation with the peak).
        categorical: params whose values are labels even when they are numbers (one indicator each).
        log: params that also get a log-scale feature (a positive param spanning a decade gets one anyway).

    Example:
        >>> model = learned(miss_rate=0.2).fit([
        ...     Observation({"n": n}, {"ram": 100 + 10 * n}) for n in range(1, 11)])
        >>> model.ready, model.bound({"n": 20})["ram"] >= 300, model.directions["n"]
        (True, True, 1)
    """
    return Learned(miss_rate=miss_rate, warmup=warmup, monotone=monotone, categorical=categorical, log=log)


class Learned:
    """Checked settings of a learned footprint; :meth:`fit` turns observations into a :class:`Model`."""

    def __init__(self, *, miss_rate: float = MISS_RATE, warmup: int | None = None,
                 monotone: Mapping[str, int] | None = None, categorical: Iterable[str] = (),
                 log: Iterable[str] = ()) -> None:
        if isinstance(miss_rate, bool) or not isinstance(miss_rate, (int, float)) or not 0 < miss_rate <= 0.5:
            raise EstimateError(f"miss_rate must be a share in (0, 0.5], but got {miss_rate!r}.")
        least = max(MIN_WARMUP, math.ceil((1 - miss_rate) / miss_rate - 1e-9))
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < least):
            raise EstimateError(f"warmup must be an int >= {least} (the fewest trials that give a bound at "
                                f"miss_rate={miss_rate:g}), but got {warmup!r}.")
        monotone = dict(monotone or {})
        for name, sign in monotone.items():
            if not isinstance(name, str) or sign not in (1, -1) or isinstance(sign, bool):
                raise EstimateError(f"monotone[{name!r}] must be +1 (memory grows with the param) or -1 "
                                    f"(it shrinks), but got {sign!r}.")
        for what, names in (("categorical", categorical), ("log", log)):
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise EstimateError(f"{what} must be a list of param names, but got {names!r}.")
        self.miss_rate = float(miss_rate)
        self.warmup = least if warmup is None else warmup
        self.monotone = monotone
        self.categorical = frozenset(categorical)
        self.log = frozenset(log)

    def __repr__(self) -> str:
        return f"learned(miss_rate={self.miss_rate:g}, warmup={self.warmup})"

    def fit(self, observations: Iterable[Observation], *, corrected: bool = False) -> "Model":
        """The model of these observations. ``corrected``: learn ``peak ~ a + b * predicted`` from each
        observation's ``predicted`` figures (a footprint function's correction) instead of the params."""
        obs = [o for o in observations if isinstance(o, Observation)]
        return Model(self, obs, corrected)


@dataclass
class _Fit:
    """One resource's fitted model: the encoder, the weights and the conformal factor (``None``: none)."""

    encoder: "_Encoder"
    weights: np.ndarray
    factor: float | None
    scores: list[float] = field(default_factory=list)
    residual: float | None = None  # the conformal residual (bytes) when the absolute score is the tighter
    base: float = 0.0  # the intercept the least factor leaves out, with the residual
    spread: float | None = None  # the conformal scaled residual when that score is the tighter (see _fit)
    noise: float = 0.0  # with ``spread``: the residual's scale where the fit is at the base


class Model:
    """Observations fitted: :meth:`bound` (the upper bound) and :meth:`center` (the fit) per resource.

    ``n`` counts the observations that ran to the end (uncensored); ``ready`` is ``n >= warmup``.
    """

    def __init__(self, settings: Learned, observations: list[Observation], corrected: bool) -> None:
        self.settings, self.corrected = settings, corrected
        self.observations = observations
        self.n = sum(not o.censored for o in observations)
        self.ready = self.n >= settings.warmup
        self.directions: dict[str, int] = {}
        self._fits: dict[str, _Fit] = {}
        if corrected:
            observations = [o for o in observations if o.predicted is not None]
        for r in RESOURCES:
            rows = [o for o in observations if _number(o.peaks.get(r)) is not None]
            if corrected:
                rows = [o for o in rows if _number((o.predicted or {}).get(r)) is not None]
            if not rows or max(float(o.peaks[r]) for o in rows) <= 0:  # type: ignore[arg-type]
                continue
            self._fits[r] = self._fit(r, rows)
        ram = self._fits.get("ram")
        self.directions = dict(settings.monotone)
        if ram is not None and not corrected:
            self.directions.update(ram.encoder.directions)

    @property
    def miss_rate(self) -> float:
        return self.settings.miss_rate

    def _fit(self, resource: str, rows: list[Observation]) -> _Fit:
        y = np.array([float(o.peaks[resource]) for o in rows])  # type: ignore[arg-type]
        censored = np.array([o.censored for o in rows])
        if self.corrected:  # the footprint's figure alone, or with the params' own features beside it
            params = _Encoder.of(self.settings, resource, rows, y)
            encoders = [_Encoder.corrected(resource, rows), _Encoder.corrected(resource, rows, params)]
        else:
            base = _directed(_Encoder.of(self.settings, resource, rows, y), self.settings, rows, y, censored)
            encoders = [base, base.with_products()] if base.products_possible else [base]
        best: _Fit | None = None
        best_err = math.inf
        for enc in encoders:
            x = enc.matrix(rows)
            weights = _fit_censored(x, y, censored)
            scores, diffs = _loo_scores(x, y, censored) if len(rows) > 1 else ([], [])
            done = [s for s, c in zip(scores, censored[-len(scores):] if scores else []) if not c]
            err = _conformal(done, self.settings.miss_rate) or float(np.max(done)) if done else math.inf
            if best is None or err < best_err:
                best, best_err, best_x, best_diffs = _Fit(enc, weights, None, scores), err, x, diffs
        assert best is not None
        best.factor = _conformal(best.scores, self.settings.miss_rate)
        residual = _conformal(best_diffs, self.settings.miss_rate)
        # learned mode only: a footprint function's correction keeps the least factor on the whole fit
        if not self.corrected and best.factor is not None and residual is not None and (~censored).any():
            fit, least = _predict(best_x, best.weights), 1.0 if resource == "threads" else MIN_FACTOR
            base = min(float(best.weights[0]), float(fit.min()))  # the intercept, at most any fit
            families = {"ratio": fit * max(best.factor, least),
                        "absolute": np.maximum(fit + residual, base + (fit - base) * least)}
            # the residual scaled by what varies: noise at the base plus the fit above it, so that one
            # large trial's miss does not widen the bound of a small one as much (a ratio multiplies a large
            # constant baseline such as TensorFlow's, a plain difference adds a large trial's miss to all)
            noise = NOISE * max(base, 0.0)
            preds = y[len(y) - len(best_diffs):] - np.array(best_diffs)
            scale = noise + np.maximum(preds - base, 0.0)
            spread = (_conformal([d / s for d, s in zip(best_diffs, scale)], self.settings.miss_rate)
                      if (scale > 0).all() else None)
            if spread is not None:
                families["scaled"] = np.maximum(fit + spread * (noise + np.maximum(fit - base, 0.0)),
                                                base + (fit - base) * least)
            done = ~censored  # the tighter family over the trials that ran to the end
            tightest = min(families, key=lambda k: float(np.mean(families[k][done] / np.maximum(y[done], 1))))
            if tightest == "absolute":
                best.residual, best.base = residual, base
            elif tightest == "scaled":
                best.spread, best.noise, best.base = spread, noise, base
        return best

    def center(self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None) -> dict[str, int]:
        """The fitted peak of ``params`` per resource (0 for a resource never observed)."""
        return {r: self._value(r, params, predicted, upper=False) for r in RESOURCES}

    def bound(self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None) -> dict[str, int]:
        """The upper bound of ``params``'s peak per resource: missed by about ``miss_rate`` of trials (0 for
        a resource never observed; the fit alone while not ``ready``). Never below what a censored trial
        whose params this assignment dominates reached (memory is monotone in each param)."""
        floor = self.floor(params)
        return {r: max(self._value(r, params, predicted, upper=True), floor.get(r, 0)) for r in RESOURCES}

    def floor(self, params: Mapping[str, Any]) -> dict[str, int]:
        """What a censored trial whose params ``params`` dominate (each numeric param at least as large in
        its memory direction, +1 until one is learned or declared; the same label for the rest; a float
        param not declared in ``monotone`` passed over: rates and coefficients are no sizes) reached, per
        resource: the least this assignment needs."""
        out: dict[str, int] = {}
        if self.corrected:
            return out
        for o in self.observations:
            if o.censored and _dominates(params, o.params, self.directions, self.settings):
                for r in RESOURCES:
                    v = _number(o.peaks.get(r))
                    if v is not None:
                        out[r] = max(out.get(r, 0), int(v))
        return out

    def dominated_by(self, params: Mapping[str, Any]) -> int | None:
        """The number of a censored trial ``params`` dominate (see :meth:`floor`), if any."""
        for o in self.observations:
            if o.censored and _dominates(params, o.params, self.directions, self.settings):
                return o.number
        return None

    def unseen(self, params: Mapping[str, Any]) -> list[str]:
        """The numeric params of ``params`` beyond every observed trial's value in the direction that takes
        less memory and that move RAM's fit by over 1% across the range seen: there the fit holds the low
        end seen, the bound is no calibrated one."""
        fit = self._fits.get("ram")
        out = []
        for name, (lo, hi, direction, _) in ({} if fit is None else fit.encoder.numeric).items():
            value = params.get(name)
            if _is_number(value) and (float(value) < lo if direction > 0 else float(value) > hi):
                low, high = (self._value("ram", {**params, name: v}, None, upper=False) for v in (lo, hi))
                if abs(high - low) > 0.01 * min(high, low):
                    out.append(name)
        return out

    def residual(self, resource: str) -> float | None:
        """The conformal residual of ``resource`` (bytes; bound = fit + residual) when that score is the one
        used, else ``None`` (the bound is fit x :meth:`factor`)."""
        fit = self._fits.get(resource)
        return None if fit is None else fit.residual

    def spread(self, resource: str) -> tuple[float, float] | None:
        """The conformal scaled residual of ``resource`` and its noise (bytes) when that score is the one
        used (bound = fit + spread x (noise + the fit above its base)), else ``None``."""
        fit = self._fits.get(resource)
        return None if fit is None or fit.spread is None else (fit.spread, fit.noise)

    def factor(self, resource: str) -> float | None:
        """The conformal factor of ``resource``: bound = fit x factor (``None``: not ready or not fitted)."""
        fit = self._fits.get(resource)
        return None if fit is None else fit.factor

    def _value(self, r: str, params: Mapping[str, Any], predicted: Mapping[str, float] | None, upper: bool) -> int:
        fit = self._fits.get(r)
        if fit is None:
            return int((predicted or {}).get(r) or 0) if self.corrected else 0
        row = fit.encoder.row(params, predicted, fit.weights)
        value = max(float(row @ fit.weights), 0.0)
        if not upper:
            return int(round(value))
        if fit.factor is not None and self.ready:
            least = 1.0 if r == "threads" else MIN_FACTOR
            if fit.residual is not None:  # fit + residual, at least MIN_FACTOR on the part above the intercept
                value = max(value + fit.residual, fit.base + (value - fit.base) * least)
            elif fit.spread is not None:  # fit + the scaled residual, the same least
                value = max(value + fit.spread * (fit.noise + max(value - fit.base, 0.0)),
                            fit.base + (value - fit.base) * least)
            else:
                value *= max(fit.factor, least)
        return int(math.ceil(round(value, 6)))  # 5.0000001 threads is 5


# -- encoding params as monotone features ------------------------------------------------------------

class _Encoder:
    """Params -> feature rows, each feature non-negative and growing in the direction that takes memory."""

    def __init__(self) -> None:
        self.numeric: dict[str, tuple[float, float, int, bool]] = {}  # name -> (lo, hi, direction, log)
        self.labels: dict[str, list[Any]] = {}
        self.products = False
        self.resource = ""
        self.scale = 1.0  # corrected mode: the predicted figure's scale
        self.params: _Encoder | None = None  # corrected mode: the params' features beside the figure

    @property
    def directions(self) -> dict[str, int]:
        return {n: d for n, (_, _, d, _) in self.numeric.items()}

    @property
    def products_possible(self) -> bool:
        return len(self.numeric) >= 1

    @classmethod
    def corrected(cls, resource: str, rows: list[Observation], params: "_Encoder | None" = None) -> "_Encoder":
        enc = cls()
        enc.resource, enc.params = resource, params
        enc.scale = max(max(float((o.predicted or {})[resource] or 0) for o in rows), 1.0)
        return enc

    @classmethod
    def of(cls, settings: Learned, resource: str, rows: list[Observation], y: np.ndarray) -> "_Encoder":
        enc = cls()
        names = sorted({n for o in rows for n in o.params})
        for name in names:
            values = [o.params.get(name) for o in rows]
            if name in settings.categorical or not all(_is_number(v) for v in values if v is not None):
                labels = []
                for v in values:
                    if v not in labels:
                        labels.append(v)
                enc.labels[name] = labels
                continue
            known = [(float(v), yy) for v, yy in zip(values, y) if v is not None]
            lo, hi = min(v for v, _ in known), max(v for v, _ in known)
            if hi <= lo:
                continue  # one value seen: nothing to learn from it
            direction = settings.monotone.get(name) or _direction(known)
            use_log = name in settings.log or (lo > 0 and hi / lo >= _DECADE)
            if use_log and lo <= 0:
                raise EstimateError(f"log param {name!r} must be positive, but the trials hold {lo!r}.")
            enc.numeric[name] = (lo, hi, direction, use_log)
        return enc

    def copy(self) -> "_Encoder":
        other = _Encoder()
        other.numeric, other.labels, other.products = dict(self.numeric), self.labels, self.products
        return other

    def with_products(self) -> "_Encoder":
        other = _Encoder()
        other.numeric, other.labels, other.products = self.numeric, self.labels, True
        return other

    def row(self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None,
            weights: np.ndarray | None = None) -> np.ndarray:
        """The feature row of ``params``; a label no trial ran counts as the costliest seen (by ``weights``)."""
        if self.resource:  # corrected mode
            value = _number((predicted or {}).get(self.resource))
            if value is None:
                raise EstimateError(f"the footprint's {self.resource} figure must be a number, but got "
                                    f"{(predicted or {}).get(self.resource)!r}.")
            extra = self.params.row(params, None, None if weights is None else np.concatenate(
                [[0.0], weights[2:]]))[1:] if self.params is not None else []
            return np.array([1.0, value / self.scale, *extra])
        linear, logs = [], []
        for name, (lo, hi, direction, use_log) in self.numeric.items():
            raw = params.get(name)
            if raw is None:
                x = lo if direction > 0 else hi  # absent (another branch): the least memory this param takes
            elif not _is_number(raw):
                raise EstimateError(f"param {name!r} must be a number (the trials gave numbers), but got {raw!r}.")
            else:
                x = float(raw)
            u = (x - lo) / (hi - lo) if direction > 0 else (hi - x) / (hi - lo)
            linear.append(max(u, 0.0))  # below the range seen: as at its low end (a bound errs high there)
            if use_log:
                if x <= 0:
                    raise EstimateError(f"param {name!r} must be positive (it is on a log scale), but got {raw!r}.")
                v = math.log(x / lo) / math.log(hi / lo)
                logs.append(max(v if direction > 0 else 1.0 - v, 0.0))
        feats = [1.0, *linear, *logs]
        if self.products:
            feats += [a * b for i, a in enumerate(linear) for b in linear[i:]]
        for name, labels in self.labels.items():
            value = params.get(name)
            if value not in labels and weights is not None:  # a label no trial ran: the costliest seen
                block = weights[len(feats):len(feats) + len(labels)]
                value = labels[int(np.argmax(block))]
            feats += [1.0 if value == lab else 0.0 for lab in labels]
        return np.array(feats)

    def matrix(self, rows: list[Observation]) -> np.ndarray:
        return np.array([self.row(o.params, o.predicted) for o in rows])


def _directed(enc: "_Encoder", settings: Learned, rows: list[Observation], y: np.ndarray,
              censored: np.ndarray) -> "_Encoder":
    """``enc`` with each undeclared param's direction flipped where that fits the trials better (a marginal
    rank correlation is confounded by the other params: a param that lowers memory can look neutral)."""
    def error(e: _Encoder) -> float:
        x = e.matrix(rows)
        fit = _predict(x, _fit_censored(x, y, censored))
        done = ~censored
        return float(np.mean(np.abs(fit[done] - y[done]) / y[done])) if done.any() else 0.0

    best = error(enc)
    if len(rows) < MIN_TURN:  # too few trials to tell a direction from noise: memory's usual one
        return enc
    for name in [n for n in enc.numeric if n not in settings.monotone]:
        lo, hi, direction, use_log = enc.numeric[name]
        other = enc.copy()
        other.numeric[name] = (lo, hi, -direction, use_log)
        err = error(other)
        if err < 0.8 * best:  # a clear improvement only: one noisy peak must not turn a param around
            enc, best = other, err
    return enc


def _direction(known: list[tuple[float, float]]) -> int:
    """+1 unless the peak clearly falls as the param grows (Spearman's rank correlation below -0.5 over at
    least ``MIN_TURN`` trials): memory's usual direction stands until the data say otherwise."""
    xs = np.array([v for v, _ in known])
    ys = np.array([y for _, y in known])
    if len(xs) < MIN_TURN:
        return 1
    rx, ry = _ranks(xs), _ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return 1
    rho = float(np.corrcoef(rx, ry)[0, 1])
    return -1 if rho < -0.5 else 1


def _ranks(a: np.ndarray) -> np.ndarray:
    order = a.argsort(kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    for v in np.unique(a):  # ties share their mean rank
        ranks[a == v] = ranks[a == v].mean()
    return ranks


# -- fitting ------------------------------------------------------------------------------------------

def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson and Hanson's active set): ``argmin |a w - b|, w >= 0``.

    Example:
        >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0])).tolist()
        [2.0, 0.0]
    """
    m, n = a.shape
    w = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    grad = a.T @ (b - a @ w)
    for _ in range(iterations):
        if passive.all() or (grad[~passive] <= 1e-12 * max(1.0, np.abs(grad).max())).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, grad)))
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (s[passive] > 0).all():
                w = s
                break
            neg = passive & (s <= 0)
            alpha = np.min(w[neg] / np.maximum(w[neg] - s[neg], 1e-300))
            w = w + alpha * (s - w)
            passive &= w > 1e-12
            w[~passive] = 0.0
            if not passive.any():
                break
        grad = a.T @ (b - a @ w)
    return w


def _solve(x: np.ndarray, y: np.ndarray, boost: np.ndarray | None = None) -> np.ndarray:
    """The relative-error non-negative fit of ``y`` on the rows ``x`` (rows weighted ``boost`` times more)."""
    weight = 1.0 / np.maximum(y, 1e-9 * max(float(y.max()), 1.0))
    if boost is not None:
        weight = weight * boost
    return nnls(x * weight[:, None], y * weight)


def _fit_censored(x: np.ndarray, y: np.ndarray, censored: np.ndarray) -> np.ndarray:
    """The fit, a censored trial's target raised to the fit where the fit says it needed more."""
    target = y.copy()
    done = ~censored
    # first the trials that ran to the end (a censored peak far below the fit must not bend it), then each
    # censored target raised to the fit wherever the fit says it needed more than it reached
    w = _solve(x[done], y[done]) if done.sum() >= 2 else _solve(x, target)
    for _ in range(_IMPUTE_ROUNDS if censored.any() else 0):
        fit = _predict(x, w)
        target = np.where(censored, np.maximum(y, fit), y)
        # a censored trial the fit puts under what it reached is a hard fact the fit must meet: weighed more
        w = _solve(x, target, np.where(censored & (fit < y), _CENSORED_WEIGHT, 1.0))
    return w


def _predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w, 0.0)


def _loo_scores(x: np.ndarray, y: np.ndarray, censored: np.ndarray) -> tuple[list[float], list[float]]:
    """Peak over, and peak minus, the leave-one-out fit for the last ``SCORED`` observations (a censored
    trial's score is a lower bound: the bound serves the decision "over the line or not", which its lower
    peak decides)."""
    scores, diffs = [], []
    for i in range(max(0, len(y) - SCORED), len(y)):
        keep = np.arange(len(y)) != i
        w = _fit_censored(x[keep], y[keep], censored[keep])
        pred = float(_predict(x[i:i + 1], w)[0])
        scores.append(float(y[i]) / max(pred, 1e-9 * max(float(y.max()), 1.0)))
        diffs.append(float(y[i]) - pred)
    return scores, diffs


def _conformal(scores: list[float], miss_rate: float) -> float | None:
    """The ``ceil((n+1)(1-miss))``-th smallest score; ``None`` while that exceeds ``n`` (no bound yet)."""
    n = len(scores)
    k = math.ceil((n + 1) * (1 - miss_rate) - 1e-9)
    if n == 0 or k > n:
        return None
    return float(sorted(scores)[k - 1])


def _dominates(params: Mapping[str, Any], other: Mapping[str, Any], directions: Mapping[str, int],
               settings: Learned) -> bool:
    if not other or set(other) - set(params):
        return False
    for name, value in other.items():
        mine = params[name]
        if name not in settings.monotone and isinstance(mine, float) and isinstance(value, float):
            continue  # a float (a rate, a coefficient) is no size: memory is not taken to move with it
        if name not in settings.categorical and _is_number(mine) and _is_number(value):
            # a direction not learned yet (one value seen) is memory's usual one: it grows with the param
            if directions.get(name, 1) * (float(mine) - float(value)) < 0:
                return False
        elif mine != value:
            return False
    return True


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(float(v))


def _number(v: Any) -> float | None:
    return float(v) if _is_number(v) else None
