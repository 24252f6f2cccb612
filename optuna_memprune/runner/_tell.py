"""The study's side of a trial, shared by the runner's loop and the Ray backend: asking a trial marked with
its runner, the guarded sampler's check before launch, and ending the trial (its record, then its final
state, then the callbacks), rejected, failed before launch or finished; the counts the progress bar shows.

Runs in the runner's process (the Ray driver's); knows nothing of how a trial is reserved, launched or
watched.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _internals, records
from ..guard import GuardedSampler
from ..guard.backend import policy_of, store_rejection, trials_of, warnings_of
from ..records import Decision
from ._owners import RUNNER
from ._storage import retry as _retry

if TYPE_CHECKING:
    from ..guard.backend import Guard, TrialGuardState

_logger = logging.getLogger("optuna_memprune.guard")


class Teller:
    """Asks the study for trials and tells it how each ended, for one ``optimize`` call."""

    def __init__(
        self, study: optuna.Study, guard: Guard, callbacks: list[Callable[[optuna.Study, FrozenTrial], None]]
    ) -> None:
        self.study, self.guard, self.callbacks = study, guard, callbacks
        self.policy = policy_of(guard)
        self.counts = {"done": 0, "rejected": 0, "pruned": 0, "failed": 0}
        self.heartbeats = _internals.heartbeat_enabled(study)

    def ask(self, mark: dict[str, object]) -> optuna.Trial:
        """A new trial, marked with its runner (``RUNNER``) in the same write; the stale trials
        of a storage with heartbeats are failed first, as ``Study.optimize`` does."""
        study = self.study
        if self.heartbeats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                _retry("failing stale trials", lambda: optuna.storages.fail_stale_trials(study))
        trial: optuna.Trial = _retry("asking for a trial", lambda: _internals.ask_marked(study, {RUNNER: mark}))
        return trial

    def check(self, trial: optuna.Trial) -> TrialGuardState:
        """The guard's state of ``trial`` after the guarded sampler checked its whole assignment (a trial of an
        unwrapped sampler runs unchecked, said once); a sampler that fails fails the trial, then raises."""
        guard = self.guard
        state = trials_of(guard).open(_internals.trial_id(trial), trial.number)
        state.enforced = True
        try:
            _retry("checking the trial", lambda: trial.relative_params)  # the guarded sampler's lookahead
        except Exception as exc:
            self.fail_before_launch(trial, state, f"the sampler failed: {type(exc).__name__}: {exc}")
            raise
        if not state.sampled:
            warnings_of(guard).once(
                "unguarded-sampler",
                "study.sampler is not guard.wrap_sampler(...): trials run unchecked, under the watchdog only.",
            )
            state.uncheck("the study's sampler is not wrapped by this guard")
        return state

    def end(
        self,
        trial: optuna.Trial,
        state: TrialGuardState,
        record: records.TrialRecord,
        final: TrialState,
        values: Any = None,
    ) -> FrozenTrial:
        """Write the record, then the final state, then run the callbacks; the trial as it ended."""
        try:
            _retry("writing the record", lambda: records.write_frozen(self.study, state.trial_id, record))
        except Exception:  # the final state matters more than the record
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        finally:
            trials_of(self.guard).close(state.trial_id)
        # ``Study.tell`` returns the trial as it ended, read after its state was set (or as another process ended it)
        frozen: FrozenTrial
        if final is TrialState.COMPLETE:
            frozen = _retry("telling the result", lambda: self.study.tell(trial, values, skip_if_finished=True))
        else:
            frozen = _retry("telling the result", lambda: self.study.tell(trial, state=final, skip_if_finished=True))
        key = {TrialState.COMPLETE: "done", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}[frozen.state]
        self.counts[key] += 1
        if record.decision is Decision.REJECTED:
            self.counts["rejected"] += 1
        _logger.info(
            "Trial %d finished %s (%s): %s", trial.number, frozen.state.name, record.decision.value, record.reason
        )
        for callback in self.callbacks:
            callback(self.study, frozen)
        return frozen

    def check_again(self, state: TrialGuardState) -> None:
        """Decide a trial again on the study's trials now (``GuardedSampler.recheck``): both runners do so,
        for a decision that may change (``GuardedSampler.may_change``: a rejection on a learned bound, a trial
        to run unchecked in the warm-up), once a running trial ended."""
        sampler = self.study.sampler
        if isinstance(sampler, GuardedSampler):
            sampler.recheck(self.study, state)

    def end_rejected(self, trial: optuna.Trial, state: TrialGuardState, *, reason: str | None = None) -> None:
        """End a trial rejected before launch PRUNED, with every param of the known space and its record."""
        if reason is not None:
            state.decision, state.reason = Decision.REJECTED, reason
        try:
            store_rejection(self.guard, trial, state, decision=Decision.REJECTED, reason=state.reason)
        except Exception:  # the trial still ends PRUNED
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        frozen = _retry(
            "telling the result", lambda: self.study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        )
        self.counts["rejected"] += 1
        self.counts["pruned"] += 1
        _logger.info("Trial %d rejected: %s", trial.number, state.reason)
        for callback in self.callbacks:
            callback(self.study, frozen)

    def fail_before_launch(self, trial: optuna.Trial, state: TrialGuardState, reason: str) -> None:
        """End a trial FAIL that never ran, its record saying ``reason``."""
        record = self.policy.record(state, {}, reason=reason)
        self.end(trial, state, record, TrialState.FAIL)

    @property
    def storage(self) -> optuna.storages.BaseStorage:
        return _internals.storage_of(self.study)
