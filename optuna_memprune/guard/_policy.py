"""The guard's rules, shared by its wrappers: predict a footprint, measure it and a reading against the
budget, describe a crossing in words, and build a trial's record.

Owns the guard's configuration; the footprint function's cache is ``_cache.py``'s. Knows nothing of Optuna's
sampler, pruner or trial machinery, nor of processes and monitors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..budget import Budget, soft_line
from ..estimate.footprint import Footprint
from ..records import RESOURCES, Decision, TrialRecord
from ..units import format_bytes
from ._cache import FootprintCache
from ._call import FootprintTimeout, NoFootprint, NotAFootprint

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from ..monitor import Reading
    from ._learning import Learning
    from ._trials import TrialGuardState


class Policy:
    """A guard's footprint function, budget and choices, and the rules every wrapper applies with them.

    Built by ``MemoryGuard`` from checked arguments; the wrappers and the runner call
    its methods. Pickles its configuration only (the cache and locks stay in their process).

    Args:
        footprint: ``params dict -> Footprint``.
        budget: the per-process limits.
        on_infeasible: ``"clamp"`` or ``"reject"``.
        clamp: names of the params that may be lowered, or ``None`` for every param that helps.
        search_space: distributions known before the first trial, or ``None``.
        interval: seconds between the monitor's readings.
        soft: the soft line as a fraction of the budget.
        footprint_timeout: seconds one footprint call may take, or ``None`` for no limit.
        on_footprint_error: ``"warn"`` or ``"raise"`` (what the sampler does when the footprint fails).
        learning: the learned model (``guard/_learning.py``), or ``None``; with it ``footprint`` may be
            ``None`` (the footprint is the learned bound).
    """

    def __init__(
        self,
        footprint: Callable[[dict[str, Any]], Footprint] | None,
        budget: Budget,
        *,
        on_infeasible: str,
        clamp: tuple[str, ...] | None,
        search_space: dict[str, BaseDistribution] | None,
        interval: float,
        soft: float,
        footprint_timeout: float | None = None,
        on_footprint_error: str = "warn",
        learning: Learning | None = None,
    ) -> None:
        self._footprint = footprint
        self._budget = budget
        self._on_infeasible = on_infeasible
        self._clamp = clamp
        self._search_space = search_space
        self._interval = interval
        self._soft = soft
        self._footprint_timeout = footprint_timeout
        self._on_footprint_error = on_footprint_error
        self._learning = learning
        self._init_cache()

    def _init_cache(self) -> None:
        self._footprints = FootprintCache(self._footprint, self._footprint_timeout)
        # the budget and soft fraction never change: their per-resource forms, asked several times a trial
        self._resources = self._budget.resources
        self._limits = self.line()

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "_footprint",
            "_budget",
            "_on_infeasible",
            "_clamp",
            "_search_space",
            "_interval",
            "_soft",
            "_footprint_timeout",
            "_on_footprint_error",
            "_learning",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    # -- the configuration ----------------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def on_infeasible(self) -> str:
        return self._on_infeasible

    @property
    def clamp(self) -> tuple[str, ...] | None:
        """The params the user allowed to be lowered; ``None``: every param that helps."""
        return self._clamp

    @property
    def search_space(self) -> dict[str, BaseDistribution] | None:
        return self._search_space

    @property
    def interval(self) -> float:
        """Seconds between the monitor's readings."""
        return self._interval

    @property
    def soft(self) -> float:
        """The soft line as a fraction of the budget."""
        return self._soft

    @property
    def footprint_timeout(self) -> float | None:
        """Seconds one footprint call may take (``None``: no limit)."""
        return self._footprint_timeout

    @property
    def on_footprint_error(self) -> str:
        """``"warn"`` (the trial runs unchecked) or ``"raise"`` (the error ends the study)."""
        return self._on_footprint_error

    @property
    def learning(self) -> Learning | None:
        """The learned model (``None``: the footprint function's figures are used as they are)."""
        return self._learning

    @property
    def can_clamp(self) -> bool:
        """Whether an infeasible trial may be clamped now: not while a learned footprint warms up (it knows
        only that some params need at least a stopped trial's peak, nothing of lower ones)."""
        learning = self._learning
        return self._on_infeasible == "clamp" and (learning is None or learning.corrected or learning.ready)

    def learned_info(
        self, params: dict[str, Any], warmup: bool = False, base: Mapping[str, int] | None = None
    ) -> dict[str, Any] | None:
        """What the record says of the learned prediction of ``params`` (``None`` without learning)."""
        if self._learning is None:
            return None
        raw = self._footprints.get(params) if self._footprint is not None else None
        return self._learning.info(params, raw, warmup, self.room(base))

    def room(self, base: Mapping[str, int] | None = None) -> dict[str, int]:
        """The soft line's limits less ``base`` (the usage a learned increment adds to, ``charged``): what a
        prediction is compared with."""
        return {r: max(v - (base or {}).get(r, 0), 1) for r, v in self.line(base).items()}

    def line(self, base: Mapping[str, int] | None = None, fraction: float | None = None) -> dict[str, int]:
        """The soft line per budgeted resource above ``base`` (the usage a learned increment adds to, measured
        at the trial's start): ``base`` plus ``soft`` of the budget above it, the margin being for what is
        predicted. Without a base: ``limits``. (Lightning's imports held 452 MiB of a 520 MiB budget:
        90% of the budget left 16 MiB to trials needing up to 60, and soft-pruned each; bench_clients.)"""
        base, f = base or {}, self._soft if fraction is None else fraction
        return {r: soft_line(v, f, base.get(r, 0)) for r, v in self._resources.items()}

    @property
    def increments(self) -> bool:
        """Whether a prediction is a trial's own increment over the usage its process starts it at (a
        footprint learned from the study's trials, without a footprint function), rather than a whole
        process's peak (a footprint function's figures, corrected or not: they count the interpreter's
        calibrated baseline, which a shared process's start level already holds)."""
        return self._learning is not None and self._footprint is None

    @property
    def own_threads(self) -> int:
        """Threads of this process the guard runs for the footprint's time limit now (its worker, kept up to
        a second after its last call): readings of a trial leave them out."""
        return self._footprints.threads

    @property
    def cached_footprints(self) -> int:
        """How many footprints the cache holds."""
        return len(self._footprints)

    # -- before launch --------------------------------------------------------------------------------

    def predict(
        self, params: dict[str, Any], *, explore: bool = True, base: Mapping[str, int] | None = None
    ) -> Footprint:
        """The footprint of ``params`` (cached). Raises what the user's function raises, TypeError when it
        returns something else than a Footprint, or ``FootprintTimeout`` over ``footprint_timeout``.

        How the limit applies (in the main thread under a SIGALRM timer, else a worker thread abandoned past
        it; a cold start; calibration not counted): ``LimitedCall``. A late answer still fills the cache
        (``FootprintCache``).
        ``explore=False``: a learned footprint's bound even where the trial would run unchecked to explore
        (a clamp search's candidates). ``base``: the usage a learned increment adds to (``room``).
        """
        if self._learning is not None:
            raw = None if self._footprint is None else self._footprints(params)
            return self._learning.footprint(params, raw, self.room(base), explore=explore)
        return self._footprints(params)

    def describe_failure(self, exc: BaseException) -> str:
        """Why a trial runs unchecked when ``predict`` raised ``exc``, in the record's words."""
        if isinstance(exc, FootprintTimeout):
            return f"{exc}; the trial runs unchecked under the monitor"
        if isinstance(exc, NotAFootprint):
            return f"the footprint function failed: it returned {exc.returned}, not a Footprint"
        return f"the footprint function failed: {type(exc).__name__}: {exc}"

    def missing_param(self, exc: BaseException, assignment: dict[str, Any]) -> str | None:
        """The name of a param the footprint asked for that the assignment lacks (``KeyError: 'x'``): a
        conditional param no earlier trial suggested. ``None`` for any other failure, and for a name a
        finished trial's record showed to be no param at all (a typo in the footprint)."""
        if type(exc) is KeyError and len(exc.args) == 1 and isinstance(exc.args[0], str):
            name = exc.args[0]
            if name not in assignment and not self._footprints.is_not_a_param(name):
                return name
        return None

    @property
    def limits(self) -> dict[str, int]:
        """The soft line per budgeted resource: what a prediction must stay under to be admitted.

        A trial predicted above it would be pruned at its first ``should_prune()``, so the pre-launch
        check, clamping and the constraints all use this line rather than the budget itself.
        """
        return dict(self._limits)

    def need(self, footprint: Footprint, base: Mapping[str, int] | None) -> dict[str, int]:
        """What admission compares with the soft line per budgeted resource: the prediction plus ``base``
        (``guard/_start.py``'s ``charged``); empty without a ``base``, where that is the prediction alone."""
        if not base:
            return {}
        return {r: int(getattr(footprint, r)) + base.get(r, 0) for r in self._resources}

    def excess(self, footprint: Footprint, base: Mapping[str, int] | None = None) -> dict[str, int]:
        """Budgeted resources the footprint (plus ``base``: the usage a learned increment adds to, in a
        shared process) puts over the soft line, with the amount over."""
        base = base or {}
        return {
            r: getattr(footprint, r) + base.get(r, 0) - limit
            for r, limit in self.line(base).items()
            if getattr(footprint, r) + base.get(r, 0) > limit
        }

    def describe_excess(self, footprint: Footprint, base: Mapping[str, int] | None = None) -> str:
        """``RAM 3.0 GiB > 1.8 GiB (90% of the budget)``, for each resource over the soft line; with a
        ``base``: ``RAM 300 MiB in use + 1.6 GiB > 1.8 GiB (...)``."""
        base, parts, lines = base or {}, [], self.line(base)
        for r in self.excess(footprint, base):
            limit, show = lines[r], (str if r == "threads" else format_bytes)
            above = " above what is in use" if r in base else ""
            line = "" if self._soft == 1.0 else f" ({self._soft:.0%} of the budget{above})"
            used = f"{show(base[r])} in use + " if r in base else ""
            parts.append(
                f"{'threads' if r == 'threads' else r.upper()} {used}{show(getattr(footprint, r))} > "
                f"{show(limit)}{line}"
            )
        return ", ".join(parts)

    def describe_figures(self, footprint: Footprint) -> str:
        """``now RAM 1.7 GiB, threads 4``: the footprint's budgeted figures."""
        parts = []
        for r in self._resources:
            value = getattr(footprint, r)
            parts.append(f"threads {value}" if r == "threads" else f"{r.upper()} {format_bytes(value)}")
        return "now " + ", ".join(parts)

    @staticmethod
    def unknown_clamp_names(names: Iterable[str], space: dict[str, Any]) -> str | None:
        """What is wrong with the clamp names that are not params of ``space`` (``None``: nothing)."""
        unknown = [n for n in names if n not in space]
        if not unknown:
            return None
        return (
            f"clamp names {unknown} are not params of the search space {sorted(space)}; "
            "fix the names, or declare params that appear only in some branches in search_space=."
        )

    @staticmethod
    def check_clamp_names(names: Iterable[str], space: dict[str, Any]) -> None:
        """ValueError naming the clamp names that are not params of ``space``."""
        problem = Policy.unknown_clamp_names(names, space)
        if problem is not None:
            raise ValueError(problem)

    # -- while a trial runs ---------------------------------------------------------------------------

    def over(
        self,
        reading: Reading,
        fraction: float,
        allowance: Mapping[str, int] | None = None,
        base: Mapping[str, int] | None = None,
    ) -> bool:
        """Whether ``reading`` crosses ``fraction`` of the budget in any budgeted resource, each line raised
        by ``allowance`` (what earlier trials left in a shared process, ``guard/_start.py``); with ``base``
        (the usage a learned increment adds to), ``fraction`` of the budget above it (``line``)."""
        a, lines = allowance or {}, self.line(base, fraction)
        values = {"ram": reading.rss, "threads": reading.threads, "vram": reading.vram}
        for r, line in lines.items():
            value = values[r]
            if value is not None and value > line + a.get(r, 0):
                return True
        return False

    def describe_breach(self, reading: Reading | None, fraction: float) -> str:
        """Which resource of ``reading`` crossed ``fraction`` of the budget, in words."""
        if reading is None:
            return "no reading"
        budget, parts = self._budget, []
        line = "the budget" if fraction >= 1.0 else f"{fraction:.0%} of the budget"
        if budget.ram is not None and reading.rss > fraction * budget.ram:
            parts.append(f"RSS {format_bytes(reading.rss)} over {line} {format_bytes(budget.ram)}")
        if budget.vram is not None and reading.vram is not None and reading.vram > fraction * budget.vram:
            parts.append(f"VRAM {format_bytes(reading.vram)} over {line} {format_bytes(budget.vram)}")
        if budget.threads is not None and reading.threads > fraction * budget.threads:
            parts.append(f"{reading.threads} threads over {line} {budget.threads}")
        return ", ".join(parts) or "no resource over the line"

    # -- after a trial --------------------------------------------------------------------------------

    def record(
        self,
        state: TrialGuardState,
        params: dict[str, Any],
        *,
        decision: Decision | None = None,
        reason: str | None = None,
        peaks: dict[str, int | None] | None = None,
        timeline: list[tuple[float, int, int, int | None]] | None = None,
        breach: Reading | None = None,
        repredict: bool = True,
    ) -> TrialRecord:
        """The record of a finished trial. ``params`` are the params it ran with, ``peaks`` the highest
        readings per resource while it ran; ``decision`` and ``reason`` default to the launch's.

        An unchecked trial is predicted from the params it ran with (the report compares that prediction
        with its peaks), unless ``repredict=False``: that call may take up to ``footprint_timeout``.
        """
        decision = state.decision if decision is None else decision
        reason = state.reason if reason is None else reason
        footprint_failed, missing = state.footprint_failed, state.first_seen
        if missing is not None and missing not in params:
            # the footprint asked for a name this trial never suggested: a bug in the footprint, not a branch
            self._footprints.not_a_param(missing)
            footprint_failed = True
            reason = reason.replace(
                state.reason,
                f"the footprint function failed: KeyError: {missing!r} (the trial suggested no param {missing!r})",
                1,
            )
        prediction = state.prediction
        ran = {k: params[k] for k in state.assignment if k in params}
        if prediction is not None and any(ran[k] != state.assignment[k] for k in ran):
            changed = sorted(k for k in ran if ran[k] != state.assignment[k])
            prediction = None
            if decision in (Decision.ADMITTED, Decision.CLAMPED):
                decision = Decision.UNCHECKED
            reason = f"{reason}; params {changed} ran with values the guard did not check".lstrip("; ")
        unused = sorted(k for k in state.clamped_from if k not in params)
        if unused:  # a param of the study's other branch or step, drawn by the lookahead: not this trial's
            reason = f"{reason}; the trial suggested no {unused}: it ran without what was lowered there"
        if prediction is None and params and footprint_failed:
            prediction = self._footprints.get(params)  # a late answer, if any: the footprint is not asked again
        elif prediction is None and params and repredict:
            try:
                prediction = self.predict(params)
            except NoFootprint:
                pass  # the reason already says there is no footprint
            except Exception as exc:  # noqa: BLE001 - the record says why there is no prediction
                reason = f"{reason}; no prediction after the run: {type(exc).__name__}: {exc}"
        learned: dict[str, Any] = {}
        if self._learning is not None:
            learned = dict(state.learned or self.learned_info(params, warmup=prediction is None) or {})
        figures: dict[str, Any] = {}
        for r in RESOURCES:
            figures[f"pred_{r}"] = None if prediction is None else getattr(prediction, r)
            figures[f"budget_{r}"] = getattr(self._budget, r)
        if prediction is not None and learned.get("center"):
            # a learned prediction is the fit; the bound the guard decided on (and the constraints) beside it
            learned["bound"] = {r: getattr(prediction, r) for r in RESOURCES}
            figures.update({f"pred_{r}": int(v) for r, v in learned["center"].items() if r in RESOURCES})
        if state.concurrent:
            reason += "; other trials ran in this process at the same time (peaks are the process's)"
        for r in RESOURCES:
            figures[f"peak_{r}"] = (peaks or {}).get(r)
            figures[f"start_{r}"] = None if state.start is None else state.start.get(r)
        return TrialRecord(
            decision=decision,
            reason=reason,
            **figures,
            clamped_from=dict(state.clamped_from),
            timeline=list(timeline or []),
            breakdown=prediction.to_dict() if prediction is not None else {},
            breach=breach._asdict() if breach is not None else {},
            soft=self._soft,
            concurrent=state.concurrent,
            learned=learned,
            leftover=dict(state.allowance),
            kept=dict(state.kept),
            need=dict(state.need) if prediction is state.prediction else {},
        )
