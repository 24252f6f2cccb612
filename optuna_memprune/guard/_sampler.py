"""GuardedSampler: the joint lookahead at a trial's start, clamp or reject, and the record after it.

Forwards every hook of the base sampler; knows nothing of the monitor or the pruner.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, GridSampler

from .. import _internals, records
from ..records import Decision
from ._call import NoFootprint
from ._clamp import ClampSearch
from ._core import check_guard, policy_of, trials_of, warnings_of
from ._learning import learn
from ._space import KnownSpace
from ._start import charge, charged
from ._trials import TrialGuardState
from ._warn import FAILURES_BEFORE_WARNING

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

    from ._core import Guard
    from ._policy import Policy

_logger = logging.getLogger("optuna_memprune.guard")
TOLD_WITHIN_S = 5.0  # how long a trial whose objective ended is waited for to be told (Optuna tells it next)


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
        guard: the ``MemoryGuard`` holding the footprint, budget and policy.

    Examples:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram=p["n"] * 2**20), omp.Budget(ram="1GiB"))
        >>> sampler = guard.wrap_sampler(optuna.samplers.TPESampler(seed=0))
    """

    def __init__(self, base_sampler: BaseSampler, guard: Guard) -> None:
        if not isinstance(base_sampler, BaseSampler):
            raise TypeError(
                f"base_sampler must be an optuna BaseSampler instance, but got {base_sampler!r} "
                f"({type(base_sampler).__name__})."
            )
        check_guard(guard)
        self._base_sampler = base_sampler
        self._guard = guard
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._lock = threading.Lock()
        self._base_spaces: dict[int, dict[str, BaseDistribution]] = {}
        self._known_space = KnownSpace()

    def __getstate__(self) -> dict[str, Any]:
        # Plain pickle (rl-zoo3 pickles its study): the base sampler and the guard travel, locks and the
        # spaces of trials running in this process do not.
        return {"_base_sampler": self._base_sampler, "_guard": self._guard}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()

    def __str__(self) -> str:
        return f"GuardedSampler({self._base_sampler})"

    @property
    def base_sampler(self) -> BaseSampler:
        """The wrapped sampler (the process-per-trial runner gives it to each trial's process)."""
        return self._base_sampler

    def reseed_rng(self) -> None:
        self._base_sampler.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        # Never check or reject here: an exception in before_trial leaves the trial RUNNING forever.
        self._base_sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        base_space = self._base_sampler.infer_relative_search_space(study, trial)
        with self._lock:
            self._base_spaces[_internals.trial_id(trial)] = base_space
        known = self._known_space(study, trial, policy_of(self._guard).search_space)
        grid = _internals.grid_names(self._base_sampler)
        if grid is not None:  # a grid samples its own names only: the others of the study are not this trial's
            known = {n: d for n, d in known.items() if n in grid}
        return {**known, **base_space}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        with self._lock:
            base_space = self._base_spaces.pop(_internals.trial_id(trial), None)
        if base_space is None:  # called directly, without infer_relative_search_space first
            base_space = self._base_sampler.infer_relative_search_space(study, trial)
        base_space = {n: d for n, d in base_space.items() if n in search_space}
        drawn = self._base_sampler.sample_relative(study, trial, base_space)
        state = trials_of(self._guard).open(_internals.trial_id(trial), trial.number)
        state.sampled = True
        if not search_space:
            return drawn
        policy = policy_of(self._guard)
        problem = None if policy.clamp is None else policy.unknown_clamp_names(policy.clamp, search_space)
        if problem is not None:  # no search_space= to check them against at construction: say so, never raise
            warnings_of(self._guard).once("clamp-names", problem)
            state.uncheck(problem.split(";")[0] + ": the trial runs unchecked under the monitor")
            return drawn
        assignment, locked = self._lookahead(study, trial, search_space, drawn)
        learn(policy, study)
        try:
            self._check(state, assignment, search_space, locked)
        except Exception as exc:  # noqa: BLE001 - a broken footprint must not stop the study (unless asked)
            state.assignment, state.space = assignment, dict(search_space)
            self._failed(state, exc, assignment)
        else:
            warnings_of(self._guard).failure(None)
            if self.may_change(state, len(trials_of(self._guard).running())):
                self._after_next_end(study, state)
        if state.decision is Decision.REJECTED and not state.enforced:
            warnings_of(self._guard).once(
                "unenforced",
                f"Trial {trial.number} is predicted over budget ({state.reason}) but will run: rejection "
                "happens in guard.wrap_objective(objective); wrap the objective to enforce it.",
            )
        return {n: state.assignment[n] for n in search_space if n in state.assignment}

    @staticmethod
    def may_change(state: TrialGuardState, running: int | None = None) -> bool:
        """Whether ``state``'s decision may change once one of the ``running`` trials ends (``None``: any
        number): it is then decided again (here for threads, else ``runner/``). A rejection on a learned bound
        (with n_jobs=2 the HF search's last 7 trials were rejected in 0.7 s while one ran whose end made the fit
        hold three params); in the runners, a trial to run unchecked in a learned warm-up that their ends
        complete (with n_jobs=2 the fifth trial, asked while the fourth ran, ran unchecked in every program of
        bench_clients; among threads a warm-up's trial runs as it was asked)."""
        learned = state.learned or {}
        if state.decision is Decision.REJECTED:
            return learned.get("phase") == "bound"
        need = learned.get("to_observe", 0) if learned.get("mode") == "learned" else 0
        return state.decision is Decision.UNCHECKED and need > 0 and (running is None or need <= running)

    def _after_next_end(self, study: Study, state: TrialGuardState) -> None:
        """Where this guard's objectives run in this process (threads), wait for one to end and be told, then
        ``recheck`` (not after ``study.stop()``)."""
        ended = trials_of(self._guard).next_end()
        if ended is None:
            return
        storage, deadline = _internals.storage_of(study), time.monotonic() + TOLD_WITHIN_S
        while time.monotonic() < deadline:  # the record is written before the objective returns, then told
            if storage.get_trial(ended).state.is_finished():
                break
            time.sleep(0.01)
        if not _internals.stop_requested(study):
            self.recheck(study, state)

    def recheck(self, study: Study, state: TrialGuardState) -> None:
        """Decide a trial's assignment again on the study's trials now, where ``may_change`` says one that
        ended since may change it; a failure leaves the first decision as it was."""
        if not self.may_change(state):
            return
        before = dataclasses.replace(state, locked=set(state.locked))
        learn(policy_of(self._guard), study)
        try:
            self._check(state, dict(before.assignment), dict(before.space), set(before.locked))
        except NoFootprint as still:  # still warming up: unchecked, saying so
            self._failed(state, still, dict(before.assignment))
        except Exception:  # the first check's answer stands
            _logger.warning("Trial %d: checking it again failed", state.number, exc_info=True)
            for f in dataclasses.fields(state):
                setattr(state, f.name, getattr(before, f.name))
            return
        first = "" if state.decision is before.decision else f" (first: {before.reason})"
        state.reason = f"{state.reason}; checked again once a running trial ended{first}"

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        state = trials_of(self._guard).get(_internals.trial_id(trial))
        if state is None or not state.checked:
            return self._base_sampler.sample_independent(study, trial, param_name, param_distribution)
        checked = state.assignment.get(param_name)
        if param_name in state.assignment and _internals.in_distribution(param_distribution, checked):
            return checked  # a checked value not served as relative (outer wrapper)
        value = self._base_sampler.sample_independent(study, trial, param_name, param_distribution)
        if state.decision is Decision.REJECTED:
            return value
        if param_name not in state.assignment:
            state.uncheck(_first_seen(param_name))
            return value
        # A known param suggested with a new range: check the new draw, lowering it if it may be lowered.
        try:
            return self._recheck(state, param_name, param_distribution, value)
        except Exception as exc:  # noqa: BLE001
            self._failed(state, exc, {**state.assignment, param_name: value}, count=False)
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
        except Exception:  # never let bookkeeping end the study
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        finally:
            self._base_sampler.after_trial(study, trial, state, values)

    def _failed(
        self, state: TrialGuardState, exc: Exception, assignment: dict[str, Any], *, count: bool = True
    ) -> None:
        """The footprint failed on ``assignment``: the trial runs unchecked, saying why; a param no earlier
        trial suggested is no failure. Repeated failures are warned about, or raised with
        ``on_footprint_error="raise"``."""
        policy = policy_of(self._guard)
        if isinstance(exc, NoFootprint):  # a guard without a footprint by design, or one warming up: no failure
            state.uncheck(str(exc))
            state.learned = policy.learned_info(assignment, warmup=True, base=charged(policy, state))
            return
        name = policy.missing_param(exc, assignment)
        if name is not None:
            state.uncheck(_first_seen(name))
            state.first_seen = name
            return
        reason = policy.describe_failure(exc)
        _logger.warning("Trial %d runs unchecked: %s", state.number, reason)
        state.uncheck(reason)
        state.footprint_failed = True
        if policy.on_footprint_error == "raise":
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(
                    f"memprune: the footprint failed on trial {state.number} (MemoryGuard(on_footprint_error='raise'))"
                )
            raise exc
        if count:
            warnings_of(self._guard).failure(
                type(exc).__name__,
                (
                    f"The footprint failed on {FAILURES_BEFORE_WARNING} trials in a row (trial {state.number}: "
                    f"{reason}); such trials run unchecked, under the monitor only. Fix the footprint function, or "
                    "pass MemoryGuard(..., on_footprint_error='raise') to stop at the first failure."
                ),
            )

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
        latest: FrozenTrial | None = None
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
                latest = latest or _internals.latest_trial(study, trial)  # GridSampler's grid_id in it
                assignment[name] = self._base_sampler.sample_independent(study, latest, name, dist)
                if not isinstance(self._base_sampler, GridSampler):  # a grid's point runs as it is or not at
                    continue  # all: lowered, it would run another point twice and this one never
            locked.add(name)
        for name, value in fixed.items():  # enqueued params outside the known space still count
            assignment.setdefault(name, value)
        return assignment, locked

    def _check(
        self,
        state: TrialGuardState,
        assignment: dict[str, Any],
        space: dict[str, BaseDistribution],
        locked: set[str],
    ) -> None:
        policy = policy_of(self._guard)
        state.assignment, state.space, state.locked = dict(assignment), dict(space), set(locked)
        state.clamped_from = {}
        base, footprint = charge(policy, state, assignment)  # in a shared process: the usage an increment adds to
        state.prediction = footprint
        state.need = policy.need(footprint, base)
        if not policy.excess(footprint, base):
            state.learned = policy.learned_info(assignment, base=base)
            state.decision, state.reason = Decision.ADMITTED, "predicted to fit under the soft line"
            return
        over = policy.describe_excess(footprint, base)
        state.learned = policy.learned_info(assignment, base=base)
        if not policy.can_clamp:
            state.decision, state.reason = Decision.REJECTED, f"predicted over budget: {over}"
            return
        names = policy.clamp if policy.clamp is not None else list(space)
        names = [n for n in names if n in space and n not in locked and not space[n].single()]
        result = _search(policy, base).clamp(assignment, space, names, footprint)
        if result is None:
            state.decision = Decision.REJECTED
            if names:
                state.reason = f"predicted over budget: {over}; no assignment fits by lowering {names}"
            else:  # every clampable param was fixed (enqueued, already suggested) or has one value
                state.reason = (
                    f"predicted over budget: {over}; no param may be lowered (fixed: "
                    f"{sorted(n for n in locked if n in space) or 'none'}"
                    f"{': a GridSampler point' if isinstance(self._base_sampler, GridSampler) else ''})"
                )
            return
        clamped, footprint = result
        state.clamped_from = {n: assignment[n] for n in clamped if clamped[n] != assignment[n]}
        state.assignment, state.prediction = clamped, footprint
        state.need = policy.need(footprint, base)
        state.learned = policy.learned_info(clamped, base=base)
        state.decision = Decision.CLAMPED
        moves = ", ".join(f"{n} {assignment[n]!r} -> {clamped[n]!r}" for n in state.clamped_from)
        state.reason = f"predicted over budget: {over}; lowered {moves} ({policy.describe_figures(footprint)})"

    def _recheck(self, state: TrialGuardState, name: str, dist: BaseDistribution, value: Any) -> Any:
        policy = policy_of(self._guard)
        candidate = {**state.assignment, name: value}
        base = charged(policy, state)
        footprint = policy.predict(candidate, base=base)
        if policy.excess(footprint, base):
            clampable = policy.on_infeasible == "clamp" and (policy.clamp is None or name in policy.clamp)
            lowered = _search(policy, base).lower_one(candidate, name, dist) if clampable else None
            if lowered is None or not lowered[2]:
                state.uncheck(
                    f"param {name!r} was re-drawn in a new range to {value!r}, over budget "
                    f"({policy.describe_excess(footprint, base)}); too late to reject"
                )
                return value
            state.clamped_from[name] = value
            value, footprint = lowered[0], lowered[1]
            state.decision = Decision.CLAMPED
            state.reason += f"; lowered {name} {state.clamped_from[name]!r} -> {value!r} (new range)"
        state.assignment[name] = value
        state.space[name] = dist
        state.prediction, state.need = footprint, policy.need(footprint, base)
        return value

    def _write_if_missing(self, study: Study, trial: FrozenTrial) -> None:
        guard, trial_id = self._guard, _internals.trial_id(trial)
        state = trials_of(guard).close(trial_id)
        if records.is_written(trial.user_attrs):
            return
        if state is None:
            state = TrialGuardState(trial_id, trial.number)
        elif state.decision is Decision.REJECTED:  # it ran anyway: the objective was not wrapped
            state.uncheck(
                f"{state.reason}, but it ran: the objective was not wrapped with "
                "guard.wrap_objective(), which is what ends rejected trials"
            )
        record = policy_of(guard).record(state, trial.params)
        records.write_frozen(study, trial_id, record)


# -- the known search space -------------------------------------------------------------------------


def _first_seen(name: str) -> str:
    return (
        f"param {name!r} was first seen in this trial (the guard checks a param before launch once an "
        "earlier trial suggested it, or when it is declared in MemoryGuard(search_space=...))"
    )


def _single_value(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[0]
    if isinstance(dist, IntDistribution):
        return int(dist.low)
    if isinstance(dist, FloatDistribution):
        return float(dist.low)
    raise TypeError(f"unsupported distribution {type(dist).__name__}")  # Optuna stores no other kind


def _search(policy: Policy, base: dict[str, int] | None = None) -> ClampSearch:
    """The clamp search under the policy's soft line, less ``base`` (``guard/_start.py``'s ``charged``). A learned
    footprint gives its bound for every candidate, below the observed range too (where it holds the low
    end's): only a trial as sampled is let run unchecked to explore there, a candidate of the search never."""
    return ClampSearch(
        functools.partial(policy.predict, explore=False, base=base),
        functools.partial(policy.excess, base=base),
        policy.room(base),
    )
