"""GuardedSampler: the joint lookahead at a trial's start, clamp or reject, and the record after it.

Forwards every hook of the base sampler; knows nothing of the monitor or the pruner.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any, Sequence

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler

from ..units import format_bytes
from .. import records as _records
from ._guard import MemoryGuard, _TrialState
from ..records import Decision

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

    from ..estimate.footprint import Footprint

_logger = logging.getLogger("optuna_memprune.guard")

_BISECT_STEPS = 24       # continuous params: bisection steps on the (log) scale ...
_BISECT_TOL = 1e-4       # ... or until the interval is this fraction of the param's range


class GuardedSampler(BaseSampler):
    """A sampler that checks each trial's whole assignment against the budget before the trial runs.

    At the first ``suggest_*`` of a trial (or when ``guard.wrap_objective`` asks first), it draws the
    assignment of every param of the known search space at once: the base sampler's relative params,
    then the base sampler's independent draws for the rest (enqueued and already suggested values are
    kept). It predicts the footprint, clamps or marks the trial rejected, and serves the checked values as
    the trial's relative params, so an unchanged define-by-run objective receives them. Params the known
    space lacks (first trial, a new conditional branch) come from the base sampler and make the trial
    unchecked. After the trial it writes the record and constraints, unless the wrapped objective did.

    It forwards every hook to the base sampler and is thread-safe (``study.optimize(n_jobs=k)``).

    Args:
        base_sampler: the sampler that proposes the params.
        guard: the :class:`MemoryGuard` holding the footprint, budget and policy.

    Example:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram=p["n"] * 2**20), omp.Budget(ram="1GiB"))
        >>> sampler = guard.wrap_sampler(optuna.samplers.TPESampler(seed=0))
    """

    def __init__(self, base_sampler: BaseSampler, guard: MemoryGuard) -> None:
        if not isinstance(base_sampler, BaseSampler):
            raise TypeError(
                f"base_sampler must be an optuna BaseSampler instance, but got {base_sampler!r} "
                f"({type(base_sampler).__name__})."
            )
        if not isinstance(guard, MemoryGuard):
            raise TypeError(f"guard must be a MemoryGuard, but got {type(guard).__name__}.")
        self._base_sampler = base_sampler
        self._guard = guard
        self._lock = threading.Lock()
        self._base_spaces: dict[int, dict[str, BaseDistribution]] = {}
        self._known_space = _KnownSpace()

    def __str__(self) -> str:
        return f"GuardedSampler({self._base_sampler})"

    def reseed_rng(self) -> None:
        self._base_sampler.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        # Never check or reject here: an exception in before_trial leaves the trial RUNNING forever.
        self._base_sampler.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        base_space = self._base_sampler.infer_relative_search_space(study, trial)
        with self._lock:
            self._base_spaces[trial._trial_id] = base_space
        return {**self._known_space(study, trial, self._guard._search_space), **base_space}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        with self._lock:
            base_space = self._base_spaces.pop(trial._trial_id, None)
        if base_space is None:  # called directly, without infer_relative_search_space first
            base_space = self._base_sampler.infer_relative_search_space(study, trial)
        base_space = {n: d for n, d in base_space.items() if n in search_space}
        drawn = self._base_sampler.sample_relative(study, trial, base_space)
        state = self._guard._open(trial._trial_id, trial.number)
        state.sampled = True
        if not search_space:
            return drawn
        if self._guard._clamp is not None:
            self._guard._check_clamp_names(self._guard._clamp, search_space)
        assignment, locked = self._lookahead(study, trial, search_space, drawn)
        try:
            self._check(state, assignment, search_space, locked)
        except Exception as exc:  # noqa: BLE001 - a broken footprint must not stop the study
            _logger.warning("Trial %d: footprint failed (%s: %s); it runs unchecked.",
                            trial.number, type(exc).__name__, exc)
            state.uncheck(f"the footprint function failed: {type(exc).__name__}: {exc}")
            state.assignment, state.space = assignment, dict(search_space)
        if state.decision is Decision.REJECTED and not state.enforced:
            self._guard._warn_once(
                "unenforced",
                f"Trial {trial.number} is predicted over budget ({state.reason}) but will run: rejection "
                "happens in guard.wrap_objective(objective); wrap the objective to enforce it.",
            )
        return {n: state.assignment[n] for n in search_space if n in state.assignment}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        state = self._guard._state(trial._trial_id)
        if state is None or not state.checked:
            return self._base_sampler.sample_independent(study, trial, param_name, param_distribution)
        if param_name in state.assignment and _contains(param_distribution, state.assignment[param_name]):
            return state.assignment[param_name]  # a checked value not served as relative (outer wrapper)
        value = self._base_sampler.sample_independent(study, trial, param_name, param_distribution)
        if state.decision is Decision.REJECTED:
            return value
        if param_name not in state.assignment:
            state.uncheck(f"param {param_name!r} is not in the known search space")
            return value
        # A known param suggested with a new range: check the new draw, lowering it if it may be lowered.
        try:
            return self._recheck(state, param_name, param_distribution, value)
        except Exception as exc:  # noqa: BLE001
            state.uncheck(f"the footprint function failed: {type(exc).__name__}: {exc}")
            return value

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        try:
            self._write_if_missing(study, trial)
        except Exception:  # noqa: BLE001 - never let bookkeeping end the study
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        finally:
            self._base_sampler.after_trial(study, trial, state, values)

    # -- the lookahead ------------------------------------------------------------------------------

    def _lookahead(
        self,
        study: Study,
        trial: FrozenTrial,
        space: dict[str, BaseDistribution],
        drawn: dict[str, Any],
    ) -> tuple[dict[str, Any], set[str]]:
        """The whole assignment over ``space``, and the names whose value the guard may not change."""
        fixed = trial.system_attrs.get("fixed_params", {}) or {}
        assignment: dict[str, Any] = {}
        locked: set[str] = set()
        for name, dist in space.items():
            if name in trial.params:
                assignment[name] = trial.params[name]
            elif name in fixed:  # enqueue_trial: Optuna uses the fixed value even when out of range
                assignment[name] = fixed[name]
            elif dist.single():
                assignment[name] = _single_value(dist)
            elif name in drawn:
                assignment[name] = drawn[name]
                continue
            else:
                assignment[name] = self._base_sampler.sample_independent(study, trial, name, dist)
                continue
            locked.add(name)
        for name, value in fixed.items():  # enqueued params outside the known space still count
            assignment.setdefault(name, value)
        return assignment, locked

    def _check(
        self,
        state: _TrialState,
        assignment: dict[str, Any],
        space: dict[str, BaseDistribution],
        locked: set[str],
    ) -> None:
        guard = self._guard
        state.assignment, state.space = dict(assignment), dict(space)
        state.clamped_from = {}
        footprint = guard._predict(assignment)
        state.prediction = footprint
        if not guard._excess(footprint):
            state.decision, state.reason = Decision.ADMITTED, "predicted to fit under the soft line"
            return
        over = guard._describe_excess(footprint)
        if guard._policy == "reject":
            state.decision, state.reason = Decision.REJECTED, f"predicted over budget: {over}"
            return
        names = guard._clamp if guard._clamp is not None else list(space)
        names = [n for n in names if n in space and n not in locked and not space[n].single()]
        result = _clamp(guard, assignment, space, names, footprint)
        if result is None:
            state.decision = Decision.REJECTED
            if names:
                state.reason = f"predicted over budget: {over}; no assignment fits by lowering {names}"
            else:  # every clampable param was fixed (enqueued, already suggested) or has one value
                state.reason = (f"predicted over budget: {over}; no param may be lowered (fixed: "
                                f"{sorted(n for n in locked if n in space) or 'none'})")
            return
        clamped, footprint = result
        state.clamped_from = {n: assignment[n] for n in clamped if clamped[n] != assignment[n]}
        state.assignment, state.prediction = clamped, footprint
        state.decision = Decision.CLAMPED
        moves = ", ".join(f"{n} {assignment[n]!r} -> {clamped[n]!r}" for n in state.clamped_from)
        state.reason = f"predicted over budget: {over}; lowered {moves} ({_figures(guard, footprint)})"

    def _recheck(
        self, state: _TrialState, name: str, dist: BaseDistribution, value: Any
    ) -> Any:
        guard = self._guard
        candidate = {**state.assignment, name: value}
        footprint = guard._predict(candidate)
        if guard._excess(footprint):
            clampable = guard._policy == "clamp" and (guard._clamp is None or name in guard._clamp)
            lowered = _lower_one(guard, candidate, name, dist) if clampable else None
            if lowered is None or not lowered[2]:
                state.uncheck(f"param {name!r} was re-drawn in a new range to {value!r}, over budget "
                              f"({guard._describe_excess(footprint)}); too late to reject")
                return value
            state.clamped_from[name] = value
            value, footprint = lowered[0], lowered[1]
            state.decision = Decision.CLAMPED
            state.reason += f"; lowered {name} {state.clamped_from[name]!r} -> {value!r} (new range)"
        state.assignment[name] = value
        state.space[name] = dist
        state.prediction = footprint
        return value

    def _write_if_missing(self, study: Study, trial: FrozenTrial) -> None:
        guard = self._guard
        state = guard._close(trial._trial_id)
        if _records.is_written(trial.user_attrs):
            return
        if state is None:
            state = _TrialState(trial._trial_id, trial.number)
        elif state.decision is Decision.REJECTED:  # it ran anyway: the objective was not wrapped
            state.uncheck(f"{state.reason}, but it ran: the objective was not wrapped with "
                          "guard.wrap_objective(), which is what ends rejected trials")
        record = guard._record(state, trial.params)
        _records.write_frozen(study, trial._trial_id, record)


# -- the known search space -------------------------------------------------------------------------

class _KnownSpace:
    """The union of the distributions the study's trials suggested (a later trial's wins), kept
    incrementally: finished trials are folded in once, running ones are looked at on every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per (storage, study): distributions of the finished trials folded in, how many leading trials
        # (by number) are all finished and folded in, and which later finished trials are folded in too
        self._studies: dict[tuple[int, int], tuple[dict[str, BaseDistribution], list[int], set[int]]] = {}

    def __call__(
        self, study: Study, trial: FrozenTrial, declared: dict[str, BaseDistribution] | None
    ) -> dict[str, BaseDistribution]:
        # The per-trial cached list the built-in samplers read too, so this costs no extra storage query.
        trials = study._get_trials(deepcopy=False, use_cache=True)
        with self._lock:
            finished, prefix, folded = self._studies.setdefault(
                (id(study._storage), study._study_id), ({}, [0], set()))
            running = []
            for other in trials[prefix[0]:]:
                if not other.state.is_finished():
                    running.append(other)
                elif other._trial_id not in folded:
                    folded.add(other._trial_id)
                    finished.update(other.distributions)
            while prefix[0] < len(trials) and trials[prefix[0]].state.is_finished():
                folded.discard(trials[prefix[0]]._trial_id)
                prefix[0] += 1
            space = dict(finished)
        for other in running:
            if other._trial_id != trial._trial_id:
                space.update(other.distributions)
        if declared:
            space.update(declared)
        return space


# -- clamping ---------------------------------------------------------------------------------------

def _clamp(
    guard: MemoryGuard,
    assignment: dict[str, Any],
    space: dict[str, BaseDistribution],
    names: list[str],
    footprint: Footprint,
) -> tuple[dict[str, Any], Footprint] | None:
    """The nearest assignment that fits, lowering ``names`` only; ``None`` when none fits.

    Params are lowered one at a time, the one whose lowering removes the most excess per unit of its
    (log-)range first; each goes to the highest value that fits, or to its lowest when none does.
    Assumes the footprint does not grow when a param is lowered.
    """
    base_excess = _excess_score(guard, footprint)
    ranked = []
    for name in names:
        lowest = _lowest(guard, assignment, name, space[name])
        if lowest is None:
            continue
        gain = base_excess - _excess_score(guard, guard._predict({**assignment, name: lowest}))
        if gain > 0:
            ranked.append((gain / _distance(space[name], assignment[name], lowest), name))
    ranked.sort(key=lambda item: -item[0])
    current = dict(assignment)
    for _, name in ranked:
        value, footprint, fits = _lower_one(guard, current, name, space[name])
        current[name] = value
        if fits:
            return current, footprint
    return None


def _lower_one(
    guard: MemoryGuard, assignment: dict[str, Any], name: str, dist: BaseDistribution
) -> tuple[Any, Footprint, bool]:
    """The highest value of ``name`` at or below its current one that fits (and its footprint, True),
    or its lowest-footprint value (and False)."""
    current = assignment[name]

    def fp(value: Any) -> Footprint:
        return guard._predict({**assignment, name: value})

    if isinstance(dist, CategoricalDistribution):
        for value in _lower_choices(guard, assignment, name, dist):
            footprint = fp(value)
            if not guard._excess(footprint):
                return value, footprint, True
        lowest = _lowest(guard, assignment, name, dist)
        value = current if lowest is None else lowest
        return value, fp(value), False

    assert isinstance(dist, (IntDistribution, FloatDistribution))
    grid = _grid(dist, current)
    if grid is not None:  # ints and stepped floats: bisection over the grid indices below the value
        low_fp = fp(grid(0))
        if guard._excess(low_fp):
            return grid(0), low_fp, False
        lo, hi = 0, _grid_index(dist, current)
        lo_fp = low_fp
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mid_fp = fp(grid(mid))
            if guard._excess(mid_fp):
                hi = mid
            else:
                lo, lo_fp = mid, mid_fp
        return grid(lo), lo_fp, True
    # continuous floats: bisection on the param's own scale (log when log=True)
    to_t, from_t = (math.log, math.exp) if dist.log else (float, float)
    low_fp = fp(float(dist.low))
    if guard._excess(low_fp):
        return float(dist.low), low_fp, False
    lo, hi = to_t(dist.low), to_t(current)
    best, best_fp = float(dist.low), low_fp
    tol = _BISECT_TOL * (to_t(dist.high) - to_t(dist.low))
    for _ in range(_BISECT_STEPS):
        if hi - lo <= tol:
            break
        mid = (lo + hi) / 2
        value = min(max(from_t(mid), float(dist.low)), float(current))
        mid_fp = fp(value)
        if guard._excess(mid_fp):
            hi = mid
        else:
            lo, best, best_fp = mid, value, mid_fp
    return best, best_fp, True


def _lowest(
    guard: MemoryGuard, assignment: dict[str, Any], name: str, dist: BaseDistribution
) -> Any | None:
    """The value of ``name`` with the lowest footprint below the current one; ``None`` if there is none."""
    current = assignment[name]
    if isinstance(dist, CategoricalDistribution):
        lower = _lower_choices(guard, assignment, name, dist)
        return lower[-1] if lower else None
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        if not current > dist.low:
            return None
        return int(dist.low) if isinstance(dist, IntDistribution) else float(dist.low)
    return None


def _lower_choices(
    guard: MemoryGuard, assignment: dict[str, Any], name: str, dist: CategoricalDistribution
) -> list[Any]:
    """The choices 'below' the current one, nearest first: numerically smaller ones when the choices are
    numbers, otherwise the choices with a lower footprint, highest footprint first."""
    current = assignment[name]
    choices = list(dist.choices)
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
        return sorted((c for c in choices if c < current), reverse=True)
    load = {i: _load(guard, guard._predict({**assignment, name: c})) for i, c in enumerate(choices)}
    here = _load(guard, guard._predict(assignment))
    lower = [i for i in load if load[i] < here and choices[i] != current]
    return [choices[i] for i in sorted(lower, key=lambda i: -load[i])]


def _grid(dist: IntDistribution | FloatDistribution, current: Any):  # type: ignore[no-untyped-def]
    """Index -> value over the grid of an int or stepped float param; ``None`` for continuous floats."""
    if isinstance(dist, IntDistribution):
        return lambda k: int(dist.low + k * dist.step)
    if dist.step is not None:
        return lambda k: float(min(dist.low + k * dist.step, dist.high))
    return None


def _grid_index(dist: IntDistribution | FloatDistribution, value: Any) -> int:
    return int(math.floor((value - dist.low) / dist.step + 1e-9))


def _distance(dist: BaseDistribution, current: Any, lowest: Any) -> float:
    """How far ``lowest`` is below ``current`` as a fraction of the param's (log-)range."""
    if isinstance(dist, (IntDistribution, FloatDistribution)) and dist.high > dist.low:
        t = math.log if dist.log else float
        return max((t(current) - t(lowest)) / (t(dist.high) - t(dist.low)), 1e-12)
    return 1.0


def _excess_score(guard: MemoryGuard, footprint: Footprint) -> float:
    return sum(over / guard._limits[r] for r, over in guard._excess(footprint).items())


def _load(guard: MemoryGuard, footprint: Footprint) -> float:
    return sum(getattr(footprint, r) / limit for r, limit in guard._limits.items())


def _figures(guard: MemoryGuard, footprint: Footprint) -> str:
    parts = []
    for r in guard._budget.resources:
        value = getattr(footprint, r)
        parts.append(f"threads {value}" if r == "threads" else f"{r.upper()} {format_bytes(value)}")
    return "now " + ", ".join(parts)


def _single_value(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[0]
    return int(dist.low) if isinstance(dist, IntDistribution) else float(dist.low)


def _contains(dist: BaseDistribution, value: Any) -> bool:
    try:
        return dist._contains(dist.to_internal_repr(value))
    except (ValueError, TypeError):
        return False
