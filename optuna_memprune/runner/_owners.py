"""Whose a ledger entry is: the key a runner gives each trial's reservation (storage, study, trial), the
ending of trials whose runner died, and what this host's ledger says of a running trial's runner.

Runs in the runner's process (and in a report's); knows nothing of how trials are launched or watched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import TYPE_CHECKING, NamedTuple

import psutil
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from .. import _internals, records
from ..records import RESOURCES, Decision
from ._storage import retry, storage_id

if TYPE_CHECKING:
    import optuna

    from ..budget import Budget
    from ..ledger import Entry, Ledger, Reaped

_logger = logging.getLogger("optuna_memprune.guard")

#: How long a reaped entry is left to the live process that reaped it before another runner ends its trial.
_REAPER_S = 30.0
ASKED = "asked"  # the trial was asked and waits to be checked, reserved and launched
LAUNCHED = "launched"  # the trial's process was started
#: The trial's system attr naming the runner that asked it ({"host", "pid", "start"}), written with the trial.
RUNNER = "memprune:runner"
#: How often a runner looks for RUNNING trials of dead runners that no ledger entry names.
_UNNAMED_EVERY_S = 5.0


def runner_mark(host: str) -> dict[str, object]:
    """What ``RUNNER`` holds for a trial this process asks on ``host``."""
    from ..ledger import start_of

    return {"host": host, "pid": os.getpid(), "start": start_of(os.getpid())}


class TrialKey(NamedTuple):
    """What a runner's ledger entry names: the trial's storage (its fingerprint), study and trial."""

    storage: str | None
    study: str
    trial_id: int
    number: int
    decision: str
    phase: str = LAUNCHED

    def dumps(self) -> str:
        return json.dumps(
            {
                "storage": self.storage,
                "study": self.study,
                "trial_id": self.trial_id,
                "number": self.number,
                "decision": self.decision,
                "phase": self.phase,
            }
        )


def parse_key(text: str) -> TrialKey | None:
    """The key of a runner's entry, None for an entry a runner did not make."""
    try:
        key = json.loads(text)
        return TrialKey(
            storage=key.get("storage"),
            study=str(key["study"]),
            trial_id=int(key["trial_id"]),
            number=int(key.get("number", -1)),
            decision=str(key.get("decision", "unchecked")),
            phase=str(key.get("phase", LAUNCHED)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _died(entry: Entry, phase: str) -> str:
    when = "while the trial ran" if phase == LAUNCHED else "before the trial's process started"
    return f"its runner (pid {entry.owner_pid} on host {entry.host}) died {when}"


def _reaper_at_work(reaped: Reaped) -> bool:
    """Whether another live process reaped the entry less than ``_REAPER_S`` ago: a runner that reaps an
    entry fails its trial next, and two runners failing one trial interleave the writes of its record."""
    if reaped.reaped_by == os.getpid() or time.time() - reaped.reaped > _REAPER_S:
        return False
    try:
        return psutil.Process(reaped.reaped_by).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class DeadRunners:
    """Ends the trials of this host's dead runners that live in one study's storage, and settles their
    reaped entries; those of other storages are left to their own runners (a warning says so once), and
    an entry another live runner reaped in the last 30 s is left to that runner.

    Without a ledger (the Ray backend's driver, ``host`` naming this machine) it fails the RUNNING trials
    whose mark (``RUNNER``) names a dead runner of this host, every ``_UNNAMED_EVERY_S``."""

    def __init__(self, study: optuna.Study, ledger: Ledger | None, budget: Budget, host: str | None = None) -> None:
        self._study, self._ledger, self._budget = study, ledger, budget
        if ledger is None and host is None:
            raise ValueError("DeadRunners needs the host: give a ledger or host=.")
        self._host: str = ledger.host if ledger is not None else str(host)
        self._storage = storage_id(study)
        self._warned: set[int] = set()
        self._looked = -_UNNAMED_EVERY_S

    def end_trials(self, trials: list[FrozenTrial] | None = None) -> None:
        """Fail every RUNNING trial of this storage whose runner died, then settle its reaped entry; every
        ``_UNNAMED_EVERY_S`` also those whose runner died before it named them on the ledger, looked for
        among ``trials`` (the study's trials just read, such as a new trial's ask read them) or, without
        them, the study's running trials read now. Each is read again before it is failed."""
        if time.monotonic() - self._looked >= _UNNAMED_EVERY_S:
            self._looked = time.monotonic()
            try:
                self._end_unnamed(trials)
            except Exception:  # looked for again in a few seconds; the study goes on
                _logger.exception("Looking for trials of dead runners that the ledger does not name failed")
        if self._ledger is None:
            return
        for reaped in self._ledger.reaped():
            key = parse_key(reaped.entry.key)
            if key is None:
                continue
            if key.storage != self._storage:
                if reaped.id not in self._warned:
                    self._warned.add(reaped.id)
                    _logger.warning(
                        "The runner of trial %d of study %r (pid %d) died; that study is in another storage, so "
                        "the trial stays RUNNING until a runner of its storage starts on this host and fails it.",
                        key.number,
                        key.study,
                        reaped.entry.owner_pid,
                    )
                continue
            if _reaper_at_work(reaped):
                continue
            try:
                self._fail(reaped, key)
            except Exception:  # tried again at the next trial; the study goes on
                _logger.exception(
                    "Trial %d of study %r: could not be failed after its runner died", key.number, key.study
                )
                continue
            self._ledger.settle(reaped)

    def _end_unnamed(self, trials: list[FrozenTrial] | None) -> None:
        """Fail the RUNNING trials a runner of this host asked (``RUNNER``) and died before it named them
        on the ledger: killed between the ask and the ledger's write, or while the ledger could not be
        written. A trial an entry names is left to ``end_trials``' reaping."""
        host = self._host
        if trials is None:
            trials = retry(
                "reading the running trials",
                lambda: self._study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)),
            )
        dead = []
        for t in trials:
            if t.state is not TrialState.RUNNING:
                continue
            mark = t.system_attrs.get(RUNNER)
            if isinstance(mark, dict) and mark.get("host") == host and not _alive(mark.get("pid"), mark.get("start")):
                dead.append((t, mark))
        if not dead:
            return
        ledger = self._ledger
        entries = [] if ledger is None else [*ledger.entries(), *(r.entry for r in ledger.reaped())]
        named = {
            key.trial_id
            for entry in entries
            if (key := parse_key(entry.key)) is not None and key.storage == self._storage
        }
        when = "before the trial ended" if ledger is None else "before it named the trial on the host ledger"
        for t, mark in dead:
            if _internals.trial_id(t) not in named:
                why = f"its runner (pid {mark['pid']} on host {host}) died {when}"
                self._fail_trial(_internals.trial_id(t), Decision.UNCHECKED.value, why, why, host, None)

    def _fail(self, reaped: Reaped, key: TrialKey) -> None:
        entry = reaped.entry
        self._fail_trial(
            key.trial_id,
            key.decision,
            _died(entry, key.phase),
            f"{_died(entry, key.phase)}; reaped by pid {reaped.reaped_by}",
            entry.host,
            entry.gpu,
        )

    def _fail_trial(
        self, trial_id: int, decision_name: str, died: str, reason: str, host: str, gpu: int | None
    ) -> None:
        """Fail a RUNNING trial whose runner died, its record saying ``reason`` (``died``: the words another
        runner failing it at the same time writes too)."""
        storage = _internals.storage_of(self._study)
        try:
            frozen = retry("reading the trial", lambda: storage.get_trial(trial_id))
        except KeyError:  # the study was deleted
            return
        if frozen.state is not TrialState.RUNNING:
            return
        written = records.read(frozen.user_attrs)
        if written is not None and died in written.reason:
            record = None  # another runner of this host is failing it: its record says why already
        elif written is not None:  # the runner died between the trial's record and its end
            record = dataclasses.replace(written, reason=f"{written.reason}; then {reason} before its end was written")
        else:
            try:
                decision = Decision(decision_name)
            except ValueError:
                decision = Decision.UNCHECKED
            record = records.TrialRecord(
                decision=decision,
                reason=reason,
                host=host,
                gpu=gpu,
                **{f"budget_{r}": getattr(self._budget, r) for r in RESOURCES},
            )
        if record is not None:
            retry("writing the record", lambda: records.write_frozen(self._study, trial_id, record))
        try:
            retry("failing the trial", lambda: storage.set_trial_state_values(trial_id, state=TrialState.FAIL))
        except UpdateFinishedTrialError:  # that other runner failed it first
            return
        said = record or written
        _logger.warning(
            "Trial %d of study %r failed: %s", frozen.number, self._study.study_name, said.reason if said else reason
        )


def _alive(pid: object, start: object) -> bool:
    """Whether the runner a ``RUNNER`` mark names still runs (unknown marks count as alive)."""
    from ..ledger import owner_alive

    if not isinstance(pid, int) or isinstance(pid, bool):
        return True
    if not isinstance(start, (int, float)):
        return psutil.pid_exists(pid)
    return owner_alive(pid, float(start))


class RunnerState(NamedTuple):
    """What this host's ledger says of the runner of one RUNNING trial."""

    pid: int
    host: str
    alive: bool
    note: str


def runner_states(study: optuna.Study, *, url: str | None = None, host: str | None = None) -> dict[int, RunnerState]:
    """The runners of the study's trials that this host's ledger (default: its file in the cache dir) holds,
    by trial number: alive, dead and not yet reaped, or dead and reaped by a runner of another storage.

    Reads only; a trial run elsewhere (another host, another ledger, ``Study.optimize``) is not in it.
    Raises ``LedgerError`` when the ledger cannot be read.
    """
    from ..ledger import owner_alive, read_host

    entries, reaped = read_host(url, host)
    mine, out = storage_id(study), {}
    next_runner = "the next runner of this study's storage on this host fails the trial"
    for entry in entries:
        key = parse_key(entry.key)
        if key is None or key.storage != mine or key.study != study.study_name:
            continue
        if owner_alive(entry.owner_pid, entry.owner_start):
            doing = "runs the trial" if key.phase == LAUNCHED else "is about to launch the trial"
            out[key.number] = RunnerState(
                entry.owner_pid, entry.host, True, f"its runner (pid {entry.owner_pid} on host {entry.host}) {doing}"
            )
        else:
            out[key.number] = RunnerState(
                entry.owner_pid, entry.host, False, f"{_died(entry, key.phase)}; {next_runner}"
            )
    for r in reaped:
        key = parse_key(r.entry.key)
        if key is None or key.storage != mine or key.study != study.study_name:
            continue
        out[key.number] = RunnerState(
            r.entry.owner_pid, r.entry.host, False, f"{_died(r.entry, key.phase)}; {next_runner}"
        )
    return out
