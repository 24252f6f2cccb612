"""The parent's loop of ``optimize()``: ask and check each trial, reserve it on the host's ledger, launch
it in its own process, and tell the study how it ended, with its record.

Runs in the runner's process only; knows nothing of what runs inside a trial's process beyond the
message it sends back (``_child``), nor of how the fork server is started.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _internals, procfs
from ..guard import GuardedSampler
from ..guard.backend import TrialGuardState, trial_forecast
from ..records import Decision
from ._child import Payload, child_main
from ._driver import Driver
from ._ending import finished_record, judge
from ._forkserver import fork_server
from ._owners import ASKED, LAUNCHED, TrialKey
from ._progress import Status
from ._reserve import next_try
from ._signals import why_ended
from ._storage import retry as _retry
from ._storage import storage_id
from ._watchdog import TrialProcess

if TYPE_CHECKING:
    from ..guard.backend import Guard
    from ..ledger import Entry, Ledger, Request
    from ._cgroup import Enforcer

_logger = logging.getLogger("optuna_memprune.guard")

_TICK_S = 0.05  # the runner's loop wakes at least this often


@dataclasses.dataclass
class _Waiting:
    """A trial asked and checked, waiting for its reservation."""

    trial: optuna.Trial
    state: TrialGuardState
    request: Request
    margins: dict[str, float]
    since: float
    hold: Entry | None  # the empty entry that names the trial on the ledger until its reservation does
    due: float = 0.0  # when to try the ledger again (``next_try``)


@dataclasses.dataclass
class _Deferred:
    """A trial a learned bound rejected while other trials ran: decided again once one of them ends."""

    trial: optuna.Trial
    state: TrialGuardState
    hold: Entry | None
    ended: int  # how many trials this runner had ended when it was deferred


class Runner(Driver):
    """The parent's loop of ``optimize``: ask, check, reserve, launch, watch, reap, tell."""

    def __init__(
        self,
        study: optuna.Study,
        objective: Callable[[optuna.Trial], Any],
        guard: Guard,
        ledger: Ledger,
        *,
        n_trials: int | None,
        timeout: float | None,
        n_workers: int,
        catch: tuple[type[BaseException], ...],
        callbacks: list[Callable[[optuna.Study, FrozenTrial], None]],
        on_host_full: str,
        enforcement: Enforcer,
    ) -> None:
        super().__init__(
            study, objective, guard, n_trials=n_trials, timeout=timeout, catch=catch, callbacks=callbacks,
            host=ledger.host, ledger=ledger,
        )  # fmt: skip
        self.ledger, self.n_workers, self.on_host_full, self.enforcement = ledger, n_workers, on_host_full, enforcement
        self.children: dict[int, TrialProcess] = {}
        self.waiting: _Waiting | None = None
        self.deferred: _Deferred | None = None
        self.counts = self.teller.counts
        self.ctx = fork_server(objective)
        self.storage_id = storage_id(study)

    # -- the loop --------------------------------------------------------------------------------

    def status(self) -> Status:
        """Where the run stands, for the progress bar (the host's figures are left out if unreadable)."""
        c = self.counts
        status = Status(
            running=len(self.children), done=c["done"], rejected=c["rejected"], pruned=c["pruned"], failed=c["failed"]
        )
        try:
            return status._replace(host_ram=self.ledger.in_use().ram, host_capacity=self.ledger.capacity.ram)
        except Exception:  # noqa: BLE001 - the bar must never stop the study
            return status

    def _loop(self, on_tick: Callable[[], None] | None) -> None:
        try:
            self.ledger.reap()
            self.dead_runners.end_trials()
            while True:
                self._reap_finished()
                if self.deferred is not None and (self.ended > self.deferred.ended or not self.children):
                    self._decide_deferred()
                idle = self.waiting is None and self.deferred is None
                if self._may_ask() and idle and len(self.children) < self.n_workers:
                    self._ask()
                if self.waiting is not None and time.monotonic() >= self.waiting.due:
                    self._admit()
                if on_tick is not None:
                    on_tick()
                if not self.children and self.waiting is None and self.deferred is None and not self._may_ask():
                    break
                self._wait()
        except BaseException as exc:
            self._abort(why_ended(exc))
            raise
        if self.fatal is not None:
            raise self.fatal

    def _wait(self) -> None:
        handles = [c.conn for c in self.children.values()] + [c.process.sentinel for c in self.children.values()]
        if handles:
            wait_any(handles, timeout=_TICK_S)
        else:
            time.sleep(_TICK_S if self.waiting is not None else 0)
        for child in self.children.values():
            child.kill_when_due()

    # -- before launch -----------------------------------------------------------------------------

    def _ask(self) -> None:
        trial = self.teller.ask(self.mark)
        self.asked += 1
        hold = self._hold(trial)  # from here a runner that finds this one dead fails the trial
        try:
            state = self.teller.check(trial)
        except Exception:
            self._release(hold)
            raise
        # among the trials the ask read (the per-trial list the check read too): a query of the running trials'
        # attrs of its own took 15 ms of CPU a trial in the fault drill
        self.dead_runners.end_trials(_internals.cached_trials(self.study))
        if self.children and GuardedSampler.may_change(state, len(self.children)):  # decided again once one ends
            self.deferred = _Deferred(trial, state, hold, self.ended)
            return
        if state.decision is Decision.REJECTED:
            self.teller.end_rejected(trial, state)
            self._release(hold)
            return
        self._reserve(trial, state, hold)

    def _decide_deferred(self) -> None:
        deferred, self.deferred = self.deferred, None
        assert deferred is not None
        trial, state, hold = deferred.trial, deferred.state, deferred.hold
        if self._may_go_on():  # not after study.stop(), the timeout or a fatal error: rejected as first checked
            self.teller.check_again(state)
        if state.decision is Decision.REJECTED:
            self.teller.end_rejected(trial, state)
            self._release(hold)
            return
        self._reserve(trial, state, hold)

    def _reserve(self, trial: optuna.Trial, state: TrialGuardState, hold: Entry | None) -> None:
        margins = _retry("reading the finished trials", self.reservations.margins)
        request = self.reservations.request(state.prediction, margins)
        self.waiting = _Waiting(trial, state, request, margins, time.monotonic(), hold)

    def _key(self, trial: optuna.Trial, decision: Decision, phase: str) -> str:
        return TrialKey(
            self.storage_id, self.study.study_name, _internals.trial_id(trial), trial.number, decision.value, phase
        ).dumps()

    def _hold(self, trial: optuna.Trial) -> Entry | None:
        """An empty entry naming the trial on the ledger while it is checked and waits for its reservation."""
        from ..ledger import Request

        try:
            return self.ledger.try_admit(Request(), self._key(trial, Decision.UNCHECKED, ASKED))
        except Exception:  # only a dead runner's trial depends on it
            _logger.warning("Trial %d: could not be named on the host ledger", trial.number, exc_info=True)
            return None

    def _release(self, entry: Entry | None) -> None:
        if entry is not None:
            try:
                self.ledger.release(entry)
            except Exception:  # the entry is reaped once this runner is gone
                _logger.warning("Releasing ledger entry %d failed", entry.id, exc_info=True)

    def _admit(self) -> None:
        from ..ledger import describe

        waiting = self.waiting
        assert waiting is not None
        ledger, request = self.ledger, waiting.request
        misfit = ledger.misfit(request)
        if misfit:
            self.waiting = None
            self.teller.end_rejected(
                waiting.trial, waiting.state, reason=f"its reservation can never fit host {ledger.host}: {misfit}"
            )
            self._release(waiting.hold)
            return
        key = self._key(waiting.trial, waiting.state.decision, LAUNCHED)
        entry = ledger.try_admit(request, key, wait=self.on_host_full != "reject")  # "reject" keeps no place in line
        if ledger.take_reaped():
            self.dead_runners.end_trials()
        if entry is None:
            waiting.due = time.monotonic() + next_try(time.monotonic() - waiting.since)
            if self.on_host_full == "reject":
                self.waiting = None
                self.teller.end_rejected(
                    waiting.trial,
                    waiting.state,
                    reason=(
                        f"the host was full: its reservation ({describe(request)}) did not fit beside the running "
                        f"trials' ({describe(ledger.in_use())}) in {describe(ledger.capacity)}"
                    ),
                )
                self._release(waiting.hold)
            return
        self.waiting = None
        waited = time.monotonic() - waiting.since
        if waited > 1.0:
            _logger.info("Trial %d waited %.1f s for its reservation on %s.", waiting.trial.number, waited, ledger.host)
        try:
            self._launch(waiting, entry)
        finally:
            self._release(waiting.hold)  # the reservation names the trial now

    def _launch(self, waiting: _Waiting, entry: Entry) -> None:
        trial, state = waiting.trial, waiting.state
        cgroup = self.enforcement.open(trial.number)
        payload = Payload(
            objective=self.objective,
            storage=_internals.storage_for_child(_internals.storage_of(self.study)),
            study_name=self.study.study_name,
            trial_id=state.trial_id,
            assignment=dict(state.assignment),
            space=dict(state.space),
            sampler=self.base_sampler,
            pruner=self.inner_pruner,
            gpu=entry.gpu,
            environ=dict(os.environ),
            cwd=os.getcwd(),
            cgroup=cgroup.join if cgroup is not None else None,
        )
        receive, send = self.ctx.Pipe(duplex=False)
        state.oom_kills = procfs.oom_kills()  # an OOM kill counted from here on may have been this trial's
        process = self.ctx.Process(target=child_main, args=(payload, send), name=f"memprune-trial-{trial.number}")
        try:
            process.start()
        except Exception as exc:
            receive.close()
            if cgroup is not None:
                cgroup.remove()
            self.ledger.release(entry)
            died = isinstance(exc, (BrokenPipeError, ConnectionResetError))  # killed from outside as it started
            reason = f"the trial could not be started in its own process: {type(exc).__name__}: {exc}" + (
                " (the process died while it read the trial from the runner)" if died else ""
            )
            self.teller.fail_before_launch(trial, state, reason)
            if died:
                return
            if "pickle" in str(exc).lower() or isinstance(exc, (TypeError, AttributeError)):
                raise TypeError(
                    f"{reason}. optimize() needs a picklable objective: a module-level function "
                    "or a functools.partial of one."
                ) from exc
            raise
        finally:
            send.close()
        child = TrialProcess(
            self.policy,
            trial,
            state,
            waiting.margins,
            entry,
            process,
            receive,
            cgroup,
            trial_forecast(self.guard, _internals.storage_of(self.study), state),
        )
        self.children[state.trial_id] = child
        child.watch()
        if self.teller.heartbeats:
            child.heartbeat = _internals.heartbeat_thread(self.study, state.trial_id)
            child.heartbeat.start()

    # -- after a trial -----------------------------------------------------------------------------

    def _reap_finished(self) -> None:
        for trial_id, child in list(self.children.items()):
            child.take_result()
            if child.process.is_alive():
                continue
            child.end()
            del self.children[trial_id]
            self.ended += 1
            try:
                self._finish(child)
            finally:
                child.close()
                if child.entry is not None:
                    self.ledger.release(child.entry)

    def _finish(self, child: TrialProcess) -> None:
        trial = child.trial
        end = judge(child, self.catch)
        if end.stop_asked:  # the objective called trial.study.stop()
            self.study.stop()
        frozen = _retry("reading the trial", lambda: _internals.storage_of(self.study).get_trial(child.state.trial_id))
        record = finished_record(self.policy, child, end, frozen.params, self.ledger.host)
        self.teller.end(trial, child.state, record, end.state, end.values)
        if end.failure is not None and self.fatal is None:
            self.fatal = end.failure

    def _abort(self, why: str) -> None:
        """The runner itself is ending abnormally (Ctrl-C, SIGTERM, an error): stop every child's process
        tree, fail its trial with ``why``."""
        for child in list(self.children.values()):
            child.stop(signal.SIGKILL)
        for child in list(self.children.values()):
            child.process.join(5)
            child.kill_group()
            try:
                record = self.policy.record(child.state, {}, reason=f"{child.state.reason}; {why} while the trial ran")
                self.teller.end(child.trial, child.state, record, TrialState.FAIL)
            except Exception:  # best effort: the next runner reaps what is left
                _logger.exception("Trial %d: could not be failed", child.trial.number)
            finally:
                child.close()
                if child.entry is not None:
                    self.ledger.release(child.entry)
        self.children.clear()
        if self.waiting is not None:
            try:
                self.teller.fail_before_launch(
                    self.waiting.trial, self.waiting.state, f"{why} while the trial waited for its reservation"
                )
            except Exception:
                _logger.exception("Trial %d: could not be failed", self.waiting.trial.number)
            try:  # its place in the host's queue; else dropped when this runner is gone, or after TICKET_TTL_S
                self.ledger.withdraw(self._key(self.waiting.trial, self.waiting.state.decision, LAUNCHED))
            except Exception:
                _logger.warning("Trial %d: could not leave the host's queue", self.waiting.trial.number, exc_info=True)
            self._release(self.waiting.hold)
            self.waiting = None
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            try:
                self.teller.fail_before_launch(
                    deferred.trial, deferred.state, f"{why} while the trial waited to be checked again"
                )
            except Exception:
                _logger.exception("Trial %d: could not be failed", deferred.trial.number)
            self._release(deferred.hold)
