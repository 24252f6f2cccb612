"""What the guard knows about each trial while it runs, and the registry of those trials in this process.

Owns the per-trial state (launch decision, checked assignment, live crossings) and its locking; knows
nothing of how a decision is reached, how readings are taken or how the record is written.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..records import Decision

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from ..estimate.footprint import Footprint
    from ..monitor import Reading

_logger = logging.getLogger("optuna_memprune.guard")


@dataclass
class TrialGuardState:
    """What the guard knows about one trial while it runs: the launch decision and the live readings."""

    trial_id: int
    number: int
    decision: Decision = Decision.UNCHECKED
    reason: str = (
        "the search space was not known before launch (no earlier trial; pass search_space= to "
        "MemoryGuard to check the first trial too)"
    )
    assignment: dict[str, Any] = field(default_factory=dict)  # the checked (maybe clamped) params
    space: dict[str, BaseDistribution] = field(default_factory=dict)
    prediction: Footprint | None = None
    clamped_from: dict[str, Any] = field(default_factory=dict)
    locked: set[str] = field(default_factory=set)  # params the check may not lower (suggested, enqueued, a grid's)
    enforced: bool = False  # run by guard.wrap_objective (rejection and the monitor apply)
    sampled: bool = False  # a GuardedSampler of this guard looked at the trial
    soft_reading: Reading | None = None  # first reading over the soft line
    hard_reading: Reading | None = None  # first reading over the budget
    soft_answered: bool = False  # GuardedPruner answered True because of the soft line
    concurrent: bool = False  # other guarded trials ran in this process at the same time
    first_seen: str | None = None  # the param the footprint asked for that no earlier trial suggested
    footprint_failed: bool = False  # the footprint raised, timed out or returned no Footprint at launch
    oom_kills: int | None = None  # the host's OOM-kill count when the runner launched the trial's process
    learned: dict[str, Any] | None = None  # the record's word on a learned prediction (mode, phase, raw)
    # In a shared process (the in-process objective) only; ``None`` / empty where the trial has its own process:
    start: dict[str, int | None] | None = None  # the process's usage at the trial's start, after the give-back
    need: dict[str, int] = field(default_factory=dict)  # what admission compared with the soft line
    left: dict[str, int] = field(default_factory=dict)  # what earlier trials left, over noise (``_start.leftover``)
    allowance: dict[str, int] = field(default_factory=dict)  # what earlier trials left, where it made the budget
    # unreachable, or ``aside`` (why it was set aside: ``_start.set_aside``): the trial's lines raised by it
    aside: str = ""
    first: bool = False  # its start was the process's first level read (the baseline)
    kept: dict[str, int] = field(default_factory=dict)  # the first trial's one-time costs (``ProcessLevels.kept``)

    @property
    def checked(self) -> bool:
        return self.decision in (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED)

    def uncheck(self, reason: str) -> None:
        """The trial runs (or ran) with params the guard did not check before launch."""
        if self.decision is not Decision.UNCHECKED:
            _logger.info("Trial %d runs unchecked: %s", self.number, reason)
        self.decision, self.reason, self.prediction = Decision.UNCHECKED, reason, None


class TrialRegistry:
    """One guard's trials in this process, by trial id: opened by the first wrapper that sees a trial,
    closed by the one that ends it; and which of them run their objective here now. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trials: dict[int, TrialGuardState] = {}
        self._running: dict[int, TrialGuardState] = {}  # trials whose objective runs in this process now
        self._ends, self._last_end = 0, -1  # how many objectives ended here, and the latest one's trial id
        self._changed = threading.Condition(self._lock)

    def open(self, trial_id: int, number: int) -> TrialGuardState:
        """The trial's state, created on first use."""
        with self._lock:
            state = self._trials.get(trial_id)
            if state is None:
                state = self._trials[trial_id] = TrialGuardState(trial_id, number)
            return state

    def get(self, trial_id: int) -> TrialGuardState | None:
        with self._lock:
            return self._trials.get(trial_id)

    def close(self, trial_id: int) -> TrialGuardState | None:
        """Forget the trial; returns its state (``None`` if it was not open)."""
        with self._lock:
            return self._trials.pop(trial_id, None)

    def enter_run(self, state: TrialGuardState) -> int:
        """A guarded objective starts in this process; returns how many run now (and marks them shared)."""
        with self._lock:
            self._running[state.trial_id] = state
            if len(self._running) > 1:
                for other in self._running.values():
                    other.concurrent = True
            return len(self._running)

    def exit_run(self, state: TrialGuardState) -> None:
        with self._lock:
            self._running.pop(state.trial_id, None)
            self._ends, self._last_end = self._ends + 1, state.trial_id
            self._changed.notify_all()

    def next_end(self) -> int | None:
        """Wait for the next objective of this process to end, if one runs; its trial id (``None``: none
        ran when called)."""
        with self._lock:
            seen = self._ends
            while self._running and self._ends == seen:
                self._changed.wait()
            return self._last_end if self._ends > seen else None

    def registered(self) -> dict[int, TrialGuardState]:
        """A copy of the open trials, by trial id (empty once every trial has ended)."""
        with self._lock:
            return dict(self._trials)

    def running(self) -> dict[int, TrialGuardState]:
        """A copy of the trials whose objective runs in this process now, by trial id."""
        with self._lock:
            return dict(self._running)
