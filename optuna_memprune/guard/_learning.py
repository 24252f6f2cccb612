"""The guard's learned footprint: the model of the study's own trials (``estimate/learn.py``), refreshed
from the study's trial records, and the footprint it gives before and after its warm-up.

Owns turning records into observations (which trials count, which are censored, a trial's own increment
over its process's usage at its start), when to refit, and the footprint the guard uses: the learned upper
bound (no footprint function), or the footprint function's figures corrected, and which trials after the
warm-up still run unchecked to be observed (below every observed trial in a param the fit holds, the fit
under the soft line). Knows nothing of the sampler's lookahead, monitors or processes; its state is the
records, so a restarted study or another worker of the same storage rebuilds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import _internals, records
from ..estimate.footprint import Component, Footprint, Kind
from ..estimate.learn import NOISE, RESOURCES, Learned, Model, Observation
from ..records import Decision
from ..units import format_bytes
from ._call import NoFootprint

if TYPE_CHECKING:
    import optuna

_logger = logging.getLogger("optuna_memprune.guard")
#: A trial that ended this way reached at least its peaks: its peaks are lower bounds (censored).
_CENSORED = (Decision.STOPPED, Decision.OUT_OF_MEMORY, Decision.SOFT_PRUNED, Decision.FORECAST_STOPPED)
#: Refits wait once this many trials are fitted and the model is ready, until they take at most ``FIT_SHARE`` of
#: the time since the last one, unless a new trial came in over its bound (or, stopped or pruned, over its fit).
#: A fit's leave-one-out solves grow with the trials squared: Optuna's quadratic example (1.6 ms trials) refitted
#: after each took 21 ms a trial at 200 trials; its LightGBM example, 91 fits in 100 trials, 7.8 of its 12 s. With
#: fewer trials each one moves the fit, and a fit takes a few milliseconds.
ALWAYS_REFIT, FIT_SHARE = 20, 0.05


class Learning:
    """A guard's learned model: settings, mode (``"learned"``: no footprint function; ``"corrected"``: the
    function's figures corrected), and the model of the observations read so far (per process).

    Pickles its settings and mode only: each process rebuilds the model from the study's records.
    """

    def __init__(self, settings: Learned, corrected: bool) -> None:
        self.settings, self.corrected = settings, corrected
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, Observation | None] = {}  # finished trial id -> observation (None: not one)
        self.model: Model = self.settings.fit([], corrected=self.corrected)
        self._unfitted = 0  # observations read since the last fit
        self._fitted_at, self._fit_seconds = 0.0, 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "corrected": self.corrected}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    @property
    def mode(self) -> str:
        return "corrected" if self.corrected else "learned"

    @property
    def ready(self) -> bool:
        return self.model.ready

    # -- the records ----------------------------------------------------------------------------------

    def refresh(self, study: optuna.Study) -> Model:
        """Read the study's finished trials not read yet (a finished record never changes) and refit when
        any of them is an observation and a refit is due (``_due``). Safe to call from several threads."""
        from optuna.trial import TrialState

        with self._lock:
            new: list[Observation] = []
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
                key = _internals.trial_id(t)
                if key in self._seen:
                    continue
                obs = observation(t.number, t.state, t.params, t.user_attrs, corrected=self.corrected)
                self._seen[key] = obs
                if obs is not None:
                    new.append(obs)
            self._unfitted += len(new)
            if self._unfitted and self._due(new):
                began = time.monotonic()
                self.model = self.settings.fit(
                    sorted((o for o in self._seen.values() if o is not None), key=lambda o: o.number or 0),
                    corrected=self.corrected,
                )
                self._fitted_at = time.monotonic()
                self._fit_seconds, self._unfitted = self._fitted_at - began, 0
            return self.model

    def _due(self, new: list[Observation]) -> bool:
        """Whether to refit now: with fewer than ``ALWAYS_REFIT`` trials fitted or before the warm-up's end,
        always; later when a new trial came in over its bound, or was stopped or pruned (a lower bound) above
        its fit (under it, it moves neither the fit nor, memory being monotone, the floor of any trial that
        dominates it), or when the last fit's time is at most ``FIT_SHARE`` of the time since it."""
        model = self.model
        if not model.ready or len(model.observations) < ALWAYS_REFIT:
            return True
        if time.monotonic() - self._fitted_at >= self._fit_seconds / FIT_SHARE:
            return True
        for o in new:
            figures = None if o.predicted is None else {r: v for r, v in o.predicted.items() if v is not None}
            limit = (model.center if o.censored else model.bound)(o.params, figures)
            if any((v := o.peaks.get(r)) is not None and v > limit[r] for r in RESOURCES):
                return True
        return False

    # -- the footprint --------------------------------------------------------------------------------

    def footprint(
        self, params: dict[str, Any], raw: Footprint | None, limits: Mapping[str, int], *, explore: bool = True
    ) -> Footprint:
        """The footprint the guard uses for ``params``: the bound (``raw`` is ``None``) or ``raw`` corrected.

        Before the warm-up without a footprint function: ``NoFootprint`` (the trial runs unchecked),
        unless the params dominate a censored trial whose peak is over ``limits`` (then that peak: memory is
        monotone, so this one needs at least as much). ``explore=False`` (a clamp search's candidates): the
        bound even where ``explore`` would let the trial run unchecked."""
        model = self.model
        if raw is None:
            if not model.ready:
                floor = model.floor(params)
                if _over(floor, limits):
                    number = model.dominated_by(params)
                    return _single(
                        floor,
                        f"at least trial #{number}'s peak (stopped there; these params are "
                        "as large in every param that takes memory)",
                    )
                raise NoFootprint(self.warmup_reason())
            bound = self._at_most_the_line(params, model.bound(params), limits)
            unseen = self.explore(params, limits) if explore and _over(bound, limits) else []
            if unseen and self._runs_under(limits):
                raise NoFootprint(
                    f"learned footprint exploring: {', '.join(unseen)} below every observed trial's, "
                    "where the bound is the low end's and no calibrated one; the fit is under the "
                    "line: the trial runs unchecked under the monitor"
                )
            if unseen:
                raise NoFootprint(
                    f"learned footprint exploring: smaller in {', '.join(unseen)} than every trial run to the "
                    "end (in each, or in the product of the sizes), none of which came in under the line (the "
                    "fit there is their level, no calibrated one): the trial runs unchecked under the monitor"
                )
            return _single(bound, f"learned upper bound ({model.n} trials, miss rate {model.miss_rate:.0%})")
        figures = {r: getattr(raw, r) for r in RESOURCES}
        bound = model.bound(params, figures)  # before the warm-up: the function's figures, the prior's quantile
        seen = len(model.observations)
        note = (
            f"learned from {model.n} trials (miss rate {model.miss_rate:.0%})"
            if model.ready
            else f"warm-up ({seen} of {self.settings.warmup} trials observed; miss rate {model.miss_rate:.0%})"
        )
        return _corrected(raw, bound, note)

    def explore(self, params: Mapping[str, Any], limits: Mapping[str, int]) -> list[str]:
        """The params to explore (``Model.unseen``) when the learned bound of ``params`` is over
        ``limits`` but the fit is under them and no stopped trial they dominate reached them: rejected, such
        a trial would never be observed and the bound at the low end never corrected. Empty otherwise."""
        model = self.model
        if self.corrected or not model.ready:
            return []
        if not _over(model.bound(params), limits) or _over(model.floor(params), limits):
            return []
        if _over(model.center(params), limits):
            return [] if self._runs_under(limits) else self._below_every_run(params)
        return model.unseen(params)

    def _at_most_the_line(
        self, params: Mapping[str, Any], bound: dict[str, int], limits: Mapping[str, int]
    ) -> dict[str, int]:
        """``bound``, but at most the line (``limits``) in a resource where a trial that ran to the end and
        came in under it covers ``params`` (``Model.below``): the reading's noise that ``Model.ceiling`` adds
        to that trial's peak alone never rejects a smaller trial. One plain torch MLP run to the end at 397
        MiB, under the 405 MiB line, capped the trials it covered at 405.57 MiB, and they were rejected."""
        out = dict(bound)
        for o in self.model.observations:
            if o.censored or self.model.below(params, o.params) is None:
                continue
            for r, line in limits.items():
                peak = o.peaks.get(r)
                if peak is not None and peak <= line < out.get(r, 0):
                    out[r] = line
        return out

    def _runs_under(self, limits: Mapping[str, int]) -> bool:
        """Whether a trial that ran to the end came in under ``limits``."""
        return any(
            all((p := o.peaks.get(r)) is None or p <= v for r, v in limits.items())
            for o in self.model.observations
            if not o.censored
        )

    def _below_every_run(self, params: Mapping[str, Any]) -> list[str]:
        """The params in which ``params`` take less memory than every trial that ran to the end, each of which
        covers them (``Model.below``) or is larger in the product of their sizes (``together=True``); none
        otherwise. Where no such trial came in under the line, the fit is their level and nothing more: one
        GPT-2 run to the end at 568 MiB (420 of them imports) put every assignment over the 558 MiB line, the
        last 15 trials were rejected and the program ended with "No feasible trials", while the smallest of
        them ran alone at 421-497 MiB. Cover alone was not enough where the one trial run to the end had the
        smallest batch and depth of the space (width 704, 1 layer, batch 8, 606 MiB): no later trial was
        covered, and the last 15 were rejected again, among them width 192, 1 layer, batch 10."""
        below: set[str] = set()
        for o in (o for o in self.model.observations if not o.censored):
            smaller = self.model.below(params, o.params) or self.model.below(params, o.params, together=True)
            if not smaller:
                return []
            below |= smaller
        return sorted(below)

    def warmup_reason(self) -> str:
        model = self.model
        seen, need = len(model.observations), self.settings.warmup
        return (
            f"learned footprint warming up: {seen} of {need} trials observed ({model.n} to the end, "
            f"{model.min_done} needed); the trial runs unchecked under the monitor"
        )

    def info(
        self, params: Mapping[str, Any], raw: Footprint | None, warmup: bool, limits: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """What the record says of the learned prediction: mode, phase, trials, miss rate, the fit's own
        figures (``center``: the bound without its error term), the footprint function's (``raw``,
        corrected mode; what the next fits learn from). Phase ``explore``: run unchecked by ``explore``.
        In the warm-up, ``to_observe``: how many more trials must end before the bound is used."""
        model = self.model
        out: dict[str, Any] = {
            "mode": self.mode,
            "phase": "warm-up"
            if not model.ready
            else "explore"
            if warmup and self.explore(params, limits or {})
            else "warm-up"
            if warmup
            else "bound",
            "n": model.n,
            "warmup": self.settings.warmup,
            "miss_rate": model.miss_rate,
        }
        if not model.ready:  # trials still to be observed before the bound is used, to the end or not
            out["to_observe"] = max(self.settings.warmup - len(model.observations), model.min_done - model.n, 1)
        quantile = model.quantile("ram")
        if quantile is not None and (model.ready or self.corrected):
            # the bound is the fit + quantile_ram x (the fit above base_ram + NOISE x (base_ram + level_ram))
            out["quantile_ram"], out["base_ram"] = round(quantile[0], 4), int(quantile[2])
            if quantile[3]:
                out["level_ram"] = int(quantile[3])
        if model.ready and not warmup:
            try:
                figures = None if raw is None else {r: getattr(raw, r) for r in RESOURCES}
                out["center"] = model.center(params, figures)
            except ValueError:  # a param the model cannot read: the record keeps the rest
                pass
        if raw is not None:
            out["raw"] = {r: int(getattr(raw, r)) for r in RESOURCES}
        return out


def observation(
    number: int, state: Any, params: Mapping[str, Any], user_attrs: Mapping[str, Any], *, corrected: bool
) -> Observation | None:
    """A finished trial as an observation: ``None`` without a record, a peak, or, when ``corrected``, the
    footprint function's figures, and ``None`` for a trial that shared its process with others unless the
    record holds its usage at its start. Where the record holds that start (``start_ram``, ...: a trial in
    a shared process) and no footprint function is corrected, the trial's own figure is its peak minus its
    start and minus what it kept, where it was its process's first (``kept``: one-time costs, which later
    trials do not pay). A trial stopped, soft-pruned, out
    of memory or failed reached at least its peaks (censored); so did one pruned by the study's pruner,
    unless its RSS had settled (``plateaued``): then its peak is what it takes."""
    from optuna.trial import TrialState

    record = records.read(user_attrs)
    if record is None or record.decision is Decision.REJECTED:
        return None
    # a footprint function's figures are a whole process's (its calibrated baseline included): corrected,
    # they are compared with the process's peak; learned alone, a trial's own increment is what is fitted
    starts = {r: None if corrected else getattr(record, f"start_{r}", None) for r in RESOURCES}
    if record.concurrent and starts["ram"] is None:
        return None  # the process's peaks, shared with other trials: no figure of this trial's own
    peaks = {}
    for r in RESOURCES:
        peak, start = getattr(record, f"peak_{r}"), starts[r]
        if start is not None:  # less what a process's first trial kept: its one-time costs (``record.kept``)
            start += record.kept.get(r, 0)
        peaks[r] = None if peak is None else max(peak - start, 0) if start is not None else peak
    if peaks["ram"] is None and peaks["threads"] is None:
        return None
    predicted = None
    if corrected:
        predicted = (record.learned or {}).get("raw")
        if not predicted:
            return None
    censored = record.decision in _CENSORED or state != TrialState.COMPLETE
    if censored and state == TrialState.PRUNED and record.decision not in _CENSORED:
        censored = not plateaued(record.timeline, starts["ram"] or 0)  # pruned by the study's own pruner
    return Observation(dict(params), peaks, censored, predicted, number, None if corrected else starts)


def plateaued(timeline: Any, start: int = 0) -> bool:
    """Whether a trial's RSS had settled: its readings (``(t_s, rss, ...)``) first came within ``NOISE``
    of their highest in the first half of the time they span, and no later reading went beyond. A training
    trial's peak is typically reached by its first optimizer step; one still growing at its end has not."""
    try:
        points = [(float(p[0]), float(p[1]) - start) for p in timeline or () if p[1] is not None]
    except (TypeError, ValueError, IndexError):
        return False
    if len(points) < 3 or points[-1][0] <= points[0][0]:
        return False
    top = max(v for _, v in points)
    reached = next(t for t, v in points if v >= (1 - NOISE) * top)
    return top > 0 and reached - points[0][0] <= 0.5 * (points[-1][0] - points[0][0])


def _single(figures: Mapping[str, int], name: str) -> Footprint:
    return Footprint.of(
        ram=int(figures.get("ram", 0)),
        vram=int(figures.get("vram", 0)),
        threads=int(figures.get("threads", 0)),
        name=name,
        kind=Kind.OTHER,
    )


def _corrected(raw: Footprint, bound: Mapping[str, int], note: str) -> Footprint:
    """``raw``'s components scaled so RAM and VRAM total ``bound``'s, threads raised to it, and a component
    naming the correction."""
    factors = {r: (bound[r] / getattr(raw, r)) if getattr(raw, r) else 1.0 for r in ("ram", "vram")}
    parts = [
        Component(
            c.name,
            c.kind,
            ram=int(round(c.ram * factors["ram"])),
            vram=int(round(c.vram * factors["vram"])),
            threads=c.threads,
            processes=c.processes,
            note=c.note,
        )
        for c in raw.components
    ]
    extra = {r: max(bound[r] - sum(getattr(c, r) for c in parts), 0) for r in RESOURCES}
    diff = bound["ram"] - raw.ram
    parts.append(
        Component(
            "learned correction",
            Kind.OTHER,
            ram=extra["ram"],
            vram=extra["vram"],
            threads=extra["threads"],
            note=f"RAM x{factors['ram']:.3f} ({'+' if diff >= 0 else '-'}{format_bytes(abs(diff))}); {note}",
        )
    )
    return Footprint(tuple(parts))


def learn(policy: Any, study: optuna.Study) -> None:
    """Refresh ``policy``'s learned model from ``study``'s records, if it learns; a failure to read them
    is logged and the model stays as it was (the guard's own failure never stops a study)."""
    learning = policy.learning
    if learning is None:
        return
    try:
        learning.refresh(study)
    except Exception:
        _logger.exception("memprune: reading the study's records for the learned footprint failed")


def _over(figures: Mapping[str, int], limits: Mapping[str, int]) -> bool:
    return any(figures.get(r, 0) > v for r, v in limits.items())
