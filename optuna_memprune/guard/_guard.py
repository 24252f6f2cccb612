"""MemoryGuard: the user's footprint, budget and policy, and the per-trial state its wrappers share.

Owns argument checking, cached footprint evaluation and the registry of running trials; the sampler,
pruner and objective wrappers do the Optuna-facing work and know nothing of each other.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..budget import Budget
from ..units import format_bytes
from ..estimate.footprint import Footprint
from ..records import RESOURCES, Decision, TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from ..monitor import Reading
    from ._objective import GuardedObjective
    from ._pruner import GuardedPruner
    from ._sampler import GuardedSampler

_logger = logging.getLogger("optuna_memprune.guard")

_POLICIES = ("clamp", "reject")
_OURS = ("optuna", "optuna_memprune")  # top-level packages whose frames a warning skips
_CACHE_SIZE = 4096  # footprints kept per guard; the clamp search evaluates tens per infeasible trial


@dataclass
class _TrialState:
    """What the guard knows about one trial while it runs: the launch decision and the live readings."""

    trial_id: int
    number: int
    decision: Decision = Decision.UNCHECKED
    reason: str = "the search space was not known before launch"
    assignment: dict[str, Any] = field(default_factory=dict)   # the checked (maybe clamped) params
    space: dict[str, "BaseDistribution"] = field(default_factory=dict)
    prediction: Footprint | None = None
    clamped_from: dict[str, Any] = field(default_factory=dict)
    enforced: bool = False          # run by guard.wrap_objective (rejection and the monitor apply)
    sampled: bool = False           # a GuardedSampler of this guard looked at the trial
    soft_reading: "Reading | None" = None   # first reading over the soft line
    hard_reading: "Reading | None" = None   # first reading over the budget
    soft_answered: bool = False     # GuardedPruner answered True because of the soft line
    concurrent: bool = False        # other guarded trials ran in this process at the same time

    @property
    def checked(self) -> bool:
        return self.decision in (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED)

    def uncheck(self, reason: str) -> None:
        """The trial runs (or ran) with params the guard did not check before launch."""
        if self.decision is not Decision.UNCHECKED:
            _logger.info("Trial %d runs unchecked: %s", self.number, reason)
        self.decision, self.reason, self.prediction = Decision.UNCHECKED, reason, None


class MemoryGuard:
    """Keeps Optuna trials inside a per-process memory and thread budget.

    Before a trial launches, the wrapped sampler draws the trial's whole assignment over the known search
    space, predicts its footprint and admits, clamps or rejects it; while the trial runs, the wrapped
    objective watches this process and stops the trial that crosses the budget; the wrapped pruner answers
    True once the process crossed the soft line (``soft`` x budget). A trial predicted above the soft line
    would be pruned at its first ``should_prune()``, so that line is what a prediction must stay under to
    be admitted, what clamping aims at, and what the constraints measure. Every trial gets a record (user
    attrs ``memprune:*``) and the constraints ``memprune_ram`` / ``memprune_vram`` / ``memprune_threads``
    (one per budgeted resource, GiB or threads over the soft line), so TPE and GP learn the infeasible
    region.

    The budget is the process's: readings are the whole process (interpreter and imports included), so a
    footprint should include the baseline (``optuna_memprune.estimate.process``). With
    ``study.optimize(n_jobs>1)`` the trials share the process and the budget applies to it as a whole.

    Notes:
        - The footprint function must be pure (same params, same footprint): results are cached.
        - A footprint that raises or returns something other than a Footprint does not stop the study:
          that trial runs unchecked under the monitor, and its record says why.
        - With conditional params the footprint receives a value for every param of the known space,
          including branches the objective will not take; gate on the branch params.
        - Name clampable params that appear only in some branches in ``search_space=`` too, or the first
          trial that lacks them raises ValueError.

    Args:
        footprint: ``params dict -> Footprint``; the predicted peak of a trial run with those params.
        budget: the per-process limits (at least one resource).
        on_infeasible: ``"clamp"`` (default) lowers clampable params to the nearest assignment that fits,
            and rejects the trial when none does; ``"reject"`` ends every infeasible trial PRUNED.
        clamp: names of the params that may be lowered. Default: every param whose lowering reduces the
            footprint (found by evaluating it at the param's low end).
        search_space: ``{name: distribution}`` known before the first trial (otherwise learned from the
            study's trials; the first trial runs unchecked).
        monitor_interval: seconds between readings of the process, > 0 (default 0.1).
        soft: the soft line as a fraction of the budget, in (0, 1] (default 0.9); 1.0 admits predictions up
            to the budget itself.

    Example:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram=p["n"] * 2**20), omp.Budget(ram="4GiB"))
        >>> study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
        >>> study.optimize(guard.wrap_objective(lambda t: t.suggest_int("n", 1, 8192)), n_trials=3)
    """

    def __init__(
        self,
        footprint: Callable[[dict[str, Any]], Footprint],
        budget: Budget,
        *,
        on_infeasible: str = "clamp",
        clamp: Iterable[str] | None = None,
        search_space: dict[str, "BaseDistribution"] | None = None,
        monitor_interval: float = 0.1,
        soft: float = 0.9,
    ) -> None:
        from optuna.distributions import BaseDistribution

        if not callable(footprint):
            raise TypeError(
                f"footprint must be a callable params dict -> Footprint, but got {type(footprint).__name__}."
            )
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be an optuna_memprune.Budget, but got {type(budget).__name__}.")
        if not budget.resources:
            raise ValueError(f"budget must limit at least one of ram, vram, threads, but got {budget}.")
        if on_infeasible not in _POLICIES:
            raise ValueError(f"on_infeasible must be 'clamp' or 'reject', but got {on_infeasible!r}.")
        if clamp is not None:
            if isinstance(clamp, str):
                raise TypeError(f"clamp must be a list of param names, but got the string {clamp!r}.")
            clamp = tuple(clamp)
            if not all(isinstance(n, str) for n in clamp):
                raise TypeError(f"clamp must be a list of param names, but got {clamp!r}.")
            if on_infeasible != "clamp":
                raise ValueError(f"clamp={list(clamp)} has no effect with on_infeasible={on_infeasible!r}.")
        if search_space is not None:
            if not isinstance(search_space, dict) or not all(
                isinstance(k, str) and isinstance(d, BaseDistribution) for k, d in search_space.items()
            ):
                raise TypeError(
                    "search_space must be a dict of param name -> optuna distribution, "
                    f"but got {search_space!r}."
                )
            search_space = dict(search_space)
            if clamp is not None:
                self._check_clamp_names(clamp, search_space)
        if isinstance(monitor_interval, bool) or not isinstance(monitor_interval, (int, float)) or not (
            monitor_interval > 0
        ):
            raise ValueError(f"monitor_interval must be a number of seconds > 0, but got {monitor_interval!r}.")
        if isinstance(soft, bool) or not isinstance(soft, (int, float)) or not (0 < soft <= 1):
            raise ValueError(f"soft must be a fraction of the budget in (0, 1], but got {soft!r}.")

        self._footprint = footprint
        self._budget = budget
        self._policy = on_infeasible
        self._clamp = clamp
        self._search_space = search_space
        self._interval = float(monitor_interval)
        self._soft = float(soft)
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._lock = threading.Lock()
        self._footprint_lock = threading.Lock()  # user footprints (torch tracing) need not be thread-safe
        self._cache: OrderedDict[tuple, Footprint] = OrderedDict()
        self._trials: dict[int, _TrialState] = {}
        self._running: dict[int, _TrialState] = {}  # trials whose objective runs in this process now
        self._warned: set[str] = set()
        self._watch: Any = None  # the objective wrapper's shared monitor of this process (created on use)

    def __getstate__(self) -> dict[str, Any]:
        # Locks, caches and running trials stay in their process; the configuration travels.
        keep = ("_footprint", "_budget", "_policy", "_clamp", "_search_space", "_interval", "_soft")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()

    def __repr__(self) -> str:
        return f"MemoryGuard({self._budget}, on_infeasible={self._policy!r}, soft={self._soft})"

    @property
    def budget(self) -> Budget:
        return self._budget

    # -- the wrappers -------------------------------------------------------------------------------

    def wrap_sampler(self, sampler: "optuna.samplers.BaseSampler") -> "GuardedSampler":
        """``sampler`` with the pre-launch check; see :class:`GuardedSampler`."""
        from ._sampler import GuardedSampler

        return GuardedSampler(sampler, self)

    def wrap_pruner(self, pruner: "optuna.pruners.BasePruner | None" = None) -> "GuardedPruner":
        """``pruner`` (or none) that also answers True over the soft line; see :class:`GuardedPruner`."""
        from ._pruner import GuardedPruner

        return GuardedPruner(pruner, self)

    def wrap_objective(self, objective: Callable[["optuna.Trial"], Any]) -> "GuardedObjective":
        """``objective`` run under the monitor, with rejection and the trial record; see GuardedObjective."""
        from ._objective import GuardedObjective

        return GuardedObjective(objective, self)

    # -- shared by the wrappers ---------------------------------------------------------------------

    def _predict(self, params: dict[str, Any]) -> Footprint:
        """The footprint of ``params`` (cached). Raises what the user's function raises, or TypeError."""
        try:
            key: tuple | None = tuple(sorted(params.items()))
            hash(key)
        except TypeError:
            key = None
        if key is not None:
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return hit
        with self._footprint_lock:
            result = self._footprint(dict(params))
        if not isinstance(result, Footprint):
            raise TypeError(f"the footprint function returned {type(result).__name__}, not a Footprint")
        if key is not None:
            with self._lock:
                self._cache[key] = result
                if len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return result

    @property
    def _limits(self) -> dict[str, int]:
        """The soft line per budgeted resource: what a prediction must stay under to be admitted.

        A trial predicted above it would be pruned at its first ``should_prune()``, so the pre-launch
        check, clamping and the constraints all use this line rather than the budget itself.
        """
        return {r: int(self._soft * v) for r, v in self._budget.resources.items()}

    def _excess(self, footprint: Footprint) -> dict[str, int]:
        """Budgeted resources the footprint puts over the soft line, with the amount over."""
        return {
            r: getattr(footprint, r) - limit
            for r, limit in self._limits.items()
            if getattr(footprint, r) > limit
        }

    def _describe_excess(self, footprint: Footprint) -> str:
        line = "" if self._soft == 1.0 else f" ({self._soft:.0%} of the budget)"
        parts = []
        for r in self._excess(footprint):
            limit = self._limits[r]
            if r == "threads":
                parts.append(f"threads {footprint.threads} > {limit}{line}")
            else:
                parts.append(f"{r.upper()} {format_bytes(getattr(footprint, r))} > {format_bytes(limit)}{line}")
        return ", ".join(parts)

    def _check_clamp_names(self, names: Iterable[str], space: dict[str, Any]) -> None:
        unknown = [n for n in names if n not in space]
        if unknown:
            raise ValueError(
                f"clamp names {unknown} are not params of the search space {sorted(space)}; "
                "fix the names, or declare params that appear only in some branches in search_space=."
            )

    def _open(self, trial_id: int, number: int) -> _TrialState:
        with self._lock:
            state = self._trials.get(trial_id)
            if state is None:
                state = self._trials[trial_id] = _TrialState(trial_id, number)
            return state

    def _state(self, trial_id: int) -> _TrialState | None:
        with self._lock:
            return self._trials.get(trial_id)

    def _close(self, trial_id: int) -> _TrialState | None:
        with self._lock:
            return self._trials.pop(trial_id, None)

    def _enter_run(self, state: _TrialState) -> int:
        """A guarded objective starts in this process; returns how many run now (and marks them shared)."""
        with self._lock:
            self._running[state.trial_id] = state
            if len(self._running) > 1:
                for other in self._running.values():
                    other.concurrent = True
            return len(self._running)

    def _exit_run(self, state: _TrialState) -> None:
        with self._lock:
            self._running.pop(state.trial_id, None)

    def _warn_once(self, key: str, message: str) -> None:
        """Warn (pointing at the user's line) and log, once per guard and key."""
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _logger.warning(message)
        warnings.warn(message, UserWarning, stacklevel=_user_stacklevel())

    def _record(
        self,
        state: _TrialState,
        params: dict[str, Any],
        *,
        decision: Decision | None = None,
        reason: str | None = None,
        peaks: dict[str, int | None] | None = None,
        timeline: list[tuple[float, int, int, int | None]] | None = None,
        breach: "Reading | None" = None,
    ) -> TrialRecord:
        """The record of a finished trial. ``params`` are the params it ran with, ``peaks`` the highest
        readings per resource while it ran."""
        decision = state.decision if decision is None else decision
        reason = state.reason if reason is None else reason
        prediction = state.prediction
        ran = {k: params[k] for k in state.assignment if k in params}
        if prediction is not None and any(ran[k] != state.assignment[k] for k in ran):
            changed = sorted(k for k in ran if ran[k] != state.assignment[k])
            prediction = None
            if decision in (Decision.ADMITTED, Decision.CLAMPED):
                decision = Decision.UNCHECKED
            reason = f"{reason}; params {changed} ran with values the guard did not check".lstrip("; ")
        if prediction is None and params:
            try:
                prediction = self._predict(params)
            except Exception as exc:  # noqa: BLE001 - the record says why there is no prediction
                reason = f"{reason}; no prediction after the run: {type(exc).__name__}: {exc}"
        figures: dict[str, Any] = {}
        for r in RESOURCES:
            figures[f"pred_{r}"] = None if prediction is None else getattr(prediction, r)
            figures[f"budget_{r}"] = getattr(self._budget, r)
        if state.concurrent:
            reason += "; other trials ran in this process at the same time (peaks are the process's)"
        for r in RESOURCES:
            figures[f"peak_{r}"] = (peaks or {}).get(r)
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
        )


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside Optuna and this package."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OURS:
        frame, level = frame.f_back, level + 1
    return level
