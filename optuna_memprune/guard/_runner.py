"""optimize(): one child process per trial, admitted by the host ledger, watched and stopped from outside.

Owns the child processes, their watchdogs and the final state of the trials they ran; the pre-launch
check is the guarded sampler's, reservations are the ledger's, the record's encoding is ``_records``'.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from ..estimate.learned import margin as learned_margin
from ..monitor import Monitor, Reading
from .. import records as _records
from ._guard import MemoryGuard, _TrialState
from ._objective import _breach, _over, store_rejection
from ._pruner import GuardedPruner
from ..records import RESOURCES, Decision
from ._sampler import GuardedSampler

if TYPE_CHECKING:
    from ..ledger import Entry, HostBudget, Ledger, Request

_logger = logging.getLogger("optuna_memprune.guard")

GRACE_S = 2.0          # SIGTERM to SIGKILL when the runner stops a trial's process tree
_TICK_S = 0.05         # the runner's loop wakes at least this often
_RETRIES = 6           # storage calls: attempts, with backoff 0.1 s x 2^k between them
_SOFT_SIGNAL = signal.SIGUSR1   # runner -> child: the tree crossed the soft line; prune at should_prune()
# What the fork server imports once, so that a trial starts fast: the storage's stack always, the heavy
# libraries when this process has them loaded (so an objective that never uses torch does not pay its RSS).
_PRELOAD = ("optuna", "sqlalchemy", "alembic.migration", "alembic.script", "optuna.storages._rdb.models", "psutil")
_PRELOAD_IF_LOADED = ("numpy", "torch", "gymnasium", "stable_baselines3")


def optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], Any],
    *,
    guard: MemoryGuard,
    n_trials: int | None = None,
    timeout: float | None = None,
    n_workers: int = 1,
    catch: Iterable[type[Exception]] | type[Exception] = (),
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
    host: "HostBudget | Ledger | None" = None,
    on_host_full: str = "wait",
    progress: bool | None = None,
) -> None:
    """Run ``study`` with each trial in its own child process, at most ``n_workers`` at a time.

    For every trial the parent asks the study, has the guarded sampler check the whole assignment before
    launch (rejected trials end PRUNED without starting a process), reserves the prediction times the
    study's learned margin on this host's ledger (waiting while the host is full, or rejecting with
    ``on_host_full="reject"``), and starts the objective in a child forked from a server that has the
    objective's module imported (and torch, when this process has it loaded). The parent watches the
    child's process tree: over the soft line the child's pruner answers True at the next
    ``should_prune()``; over the budget the tree gets SIGTERM, then SIGKILL after ``GRACE_S``, and the
    trial ends PRUNED with the reading. Intermediate values and
    pruning go through the study's storage; the parent writes the record and the final state, so a child
    killed by the kernel or a crash ends FAIL with the reason and its constraints, never RUNNING.

    Notes:
        - The study needs a storage other processes can open (``sqlite:///file.db``, PostgreSQL, a
          journal file): an in-memory study cannot be shared with a child.
        - ``objective`` must be picklable: a module-level function (or a ``functools.partial`` of one).
          A script that calls ``optimize`` must guard its entry point with ``if __name__ == "__main__":``.
        - If this process is killed, its children die with it (the fork server exits and they get
          SIGKILL), and the next runner on this host reaps its reservations and fails its trials with the
          reason. With an RDB storage that has heartbeats, workers on other hosts fail them as well.
        - Over several hosts: run ``optimize`` (or ``memprune worker``) on each with the same
          PostgreSQL storage; each host keeps its own ledger.

    Args:
        study: the study; its sampler should be ``guard.wrap_sampler(...)`` and its pruner
            ``guard.wrap_pruner(...)`` (without them trials run unchecked, under the watchdog only).
        objective: ``trial -> value(s)``, run in the child.
        guard: the guard whose footprint, budget and policy apply.
        n_trials: trials this call runs, rejected ones included (None: until ``timeout`` or
            ``study.stop()``).
        timeout: seconds after which no new trial starts (running ones finish).
        n_workers: children running at the same time, >= 1.
        catch: exception types of the objective that fail the trial and let the study go on; any other
            fails the trial and is raised once the running trials have finished.
        callbacks: ``callback(study, frozen_trial)`` after each trial, in the parent.
        host: this host's budget (:class:`~optuna_memprune.ledger.HostBudget`, default ``HostBudget()``:
            all of the memory available now, less 10%) or a :class:`~optuna_memprune.ledger.Ledger`
            (another host id or ledger database).
        on_host_full: ``"wait"`` (default) until the reservation fits, or ``"reject"`` the trial.
        progress: show a progress bar (default: when stderr is a terminal).
    """
    if not isinstance(guard, MemoryGuard):
        raise TypeError(f"guard must be a MemoryGuard, but got {type(guard).__name__}.")
    if not isinstance(study, optuna.Study):
        raise TypeError(f"study must be an optuna.Study, but got {type(study).__name__}.")
    if not callable(objective):
        raise TypeError(f"objective must be callable, but got {type(objective).__name__}.")
    if isinstance(study._storage, optuna.storages.InMemoryStorage):
        raise ValueError("optimize() runs each trial in its own process, which cannot open an in-memory "
                         "study: create the study with a storage URL (sqlite:///file.db, postgresql+psycopg://...).")
    if n_trials is not None and (isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0):
        raise ValueError(f"n_trials must be an int >= 0 or None, but got {n_trials!r}.")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, but got {timeout!r}.")
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be an int >= 1, but got {n_workers!r}.")
    if on_host_full not in ("wait", "reject"):
        raise ValueError(f"on_host_full must be 'wait' or 'reject', but got {on_host_full!r}.")
    catch = (catch,) if isinstance(catch, type) else tuple(catch)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in catch):
        raise TypeError(f"catch must be exception types, but got {catch!r}.")
    from ..ledger import HostBudget, Ledger

    if host is None:
        host = HostBudget()
    if isinstance(host, HostBudget):
        ledger = Ledger(host)
    elif isinstance(host, Ledger):
        ledger = host
    else:
        raise TypeError(f"host must be a HostBudget, a Ledger or None, but got {type(host).__name__}.")
    runner = _Runner(study, objective, guard, ledger, n_trials=n_trials, timeout=timeout, n_workers=n_workers,
                     catch=catch, callbacks=list(callbacks or ()), on_host_full=on_host_full)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    try:
        if show:
            from ._progress import Progress

            with Progress(runner) as bar:
                runner.run(bar.update)
        else:
            runner.run(None)
    finally:
        if host is not ledger:
            ledger.close()
        _stop_fork_server()


# -- the parent ------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Waiting:
    """A trial asked and checked, waiting for its reservation."""

    trial: optuna.Trial
    state: _TrialState
    request: "Request"
    margins: dict[str, float]
    since: float


class _Child:
    """One trial's process: its watchdog, its reservation, what came back."""

    def __init__(self, runner: "_Runner", waiting: _Waiting, entry: "Entry", process: Any, conn: Any) -> None:
        self.trial, self.state, self.margins = waiting.trial, waiting.state, waiting.margins
        self.reserved_prediction = waiting.state.prediction is not None  # else it reserved the budget
        self.entry, self.process, self.conn = entry, process, conn
        self.guard = runner.guard
        self.result: tuple | None = None
        self.soft_reading: Reading | None = None
        self.hard_reading: Reading | None = None
        self.stopped_at: float | None = None
        self.killed = False
        self.ended = 0.0
        self.monitor: Monitor | None = None
        self.heartbeat: Any = None

    def watch(self) -> None:
        try:
            self.monitor = Monitor(self.process.pid, interval=self.guard._interval,
                                   on_reading=self.on_reading).start()
        except Exception as exc:  # noqa: BLE001 - gone already (it ends below) or unreadable
            _logger.warning("Trial %d: its process could not be watched: %s", self.trial.number, exc)

    def on_reading(self, reading: Reading) -> None:
        """From the watchdog's thread: signal the soft line once, stop the tree at the budget."""
        guard = self.guard
        if self.soft_reading is None and _over(guard, reading, guard._soft):
            self.soft_reading = reading
            _signal(self.process.pid, _SOFT_SIGNAL)
        if self.hard_reading is None and _over(guard, reading, 1.0):
            self.hard_reading = reading
            self.stop(signal.SIGTERM)

    def stop(self, sig: int) -> None:
        """Send ``sig`` to every live process of the trial's tree (children first)."""
        procs = self.monitor.processes() if self.monitor is not None else []
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self.killed = self.killed or sig == signal.SIGKILL
        for proc in reversed(procs):
            try:
                proc.send_signal(sig)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        _signal(self.process.pid, sig)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.heartbeat is not None:
            self.heartbeat.join()
        self.conn.close()


class _Runner:
    def __init__(self, study: optuna.Study, objective: Callable, guard: MemoryGuard, ledger: "Ledger", *,
                 n_trials: int | None, timeout: float | None, n_workers: int, catch: tuple,
                 callbacks: list, on_host_full: str) -> None:
        self.study, self.objective, self.guard, self.ledger = study, objective, guard, ledger
        self.n_trials, self.n_workers, self.catch = n_trials, n_workers, catch
        self.callbacks, self.on_host_full = callbacks, on_host_full
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.asked = 0
        self.children: dict[int, _Child] = {}
        self.waiting: _Waiting | None = None
        self.fatal: BaseException | None = None
        self.counts = {"done": 0, "rejected": 0, "pruned": 0, "failed": 0}
        self.pairs: dict[int, dict[str, tuple[int, int]]] = {}  # finished trial -> (peak, pred) per resource
        sampler, pruner = study.sampler, study.pruner
        self.base_sampler: BaseSampler = sampler._base_sampler if isinstance(sampler, GuardedSampler) else sampler
        self.inner_pruner = pruner._wrapped_pruner if isinstance(pruner, GuardedPruner) else pruner
        self.ctx = _fork_server(objective)
        self.heartbeats = optuna.storages._heartbeat.is_heartbeat_enabled(study._storage)
        self.storage_id = _storage_id(study._storage)

    # -- the loop --------------------------------------------------------------------------------

    def run(self, on_tick: Callable[["_Runner"], None] | None) -> None:
        study = self.study
        if study._thread_local.in_optimize_loop:
            raise RuntimeError("Nested invocation of optimize() (or Study.optimize) isn't allowed.")
        study._thread_local.in_optimize_loop, study._stop_flag = True, False  # study.stop() in a callback
        try:
            self._loop(on_tick)
        finally:
            study._thread_local.in_optimize_loop = False

    def _loop(self, on_tick: Callable[["_Runner"], None] | None) -> None:
        try:
            while True:
                self._reap_finished()
                if self._may_ask() and self.waiting is None and len(self.children) < self.n_workers:
                    self._ask()
                if self.waiting is not None:
                    self._admit()
                if on_tick is not None:
                    on_tick(self)
                if not self.children and self.waiting is None and not self._may_ask():
                    break
                self._wait()
        except BaseException:
            self._abort()
            raise
        if self.fatal is not None:
            raise self.fatal

    def _may_ask(self) -> bool:
        return (self.fatal is None and not self.study._stop_flag
                and (self.n_trials is None or self.asked < self.n_trials)
                and (self.deadline is None or time.monotonic() < self.deadline))

    def _wait(self) -> None:
        handles = [c.conn for c in self.children.values()] + [c.process.sentinel for c in self.children.values()]
        if handles:
            wait_any(handles, timeout=_TICK_S)
        else:
            time.sleep(_TICK_S if self.waiting is not None else 0)
        now = time.monotonic()
        for child in self.children.values():
            if child.stopped_at is not None and not child.killed and now - child.stopped_at > GRACE_S:
                child.stop(signal.SIGKILL)

    # -- before launch -----------------------------------------------------------------------------

    def _ask(self) -> None:
        guard, study = self.guard, self.study
        if self.heartbeats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                _retry("failing stale trials", lambda: optuna.storages.fail_stale_trials(study))
        trial = _retry("asking for a trial", study.ask)
        self.asked += 1
        state = guard._open(trial._trial_id, trial.number)
        state.enforced = True
        try:
            trial.relative_params  # the guarded sampler's lookahead
        except Exception as exc:
            self._fail_before_launch(trial, state, f"the sampler failed: {type(exc).__name__}: {exc}")
            raise
        if not state.sampled:
            guard._warn_once("unguarded-sampler", "study.sampler is not guard.wrap_sampler(...): trials run "
                             "unchecked, under the watchdog only.")
            state.uncheck("the study's sampler is not wrapped by this guard")
        if state.decision is Decision.REJECTED:
            self._end_rejected(trial, state)
            return
        margins = self._margins()
        self.waiting = _Waiting(trial, state, self._request(state, margins), margins, time.monotonic())

    def _request(self, state: _TrialState, margins: dict[str, float]) -> "Request":
        """What the trial reserves: prediction x margin, never more than the per-trial budget (the
        watchdog stops a tree that crosses it), and the budget itself when unchecked."""
        from ..ledger import Request

        budget, prediction = self.guard._budget, state.prediction
        figures = {}
        for r in RESOURCES:
            limit = getattr(budget, r)
            if prediction is not None:
                figures[r] = math.ceil(getattr(prediction, r) * margins.get(r, 1.0))
                if limit is not None:
                    figures[r] = min(figures[r], limit)
            else:
                figures[r] = limit or 0
        if not self.ledger.capacity.gpus:
            figures["vram"] = 0  # a host without GPUs runs the trial on its CPU
        return Request(ram=figures["ram"], vram=figures["vram"], threads=figures["threads"])

    def _margins(self) -> dict[str, float]:
        """The study's learned margin per resource, from the trials that ran to the end alone.

        A finished trial's record never changes, so each is read once (its timeline JSON included), not
        at every launch."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t._trial_id in self.pairs:
                continue
            record = _records.read(t.user_attrs)
            ran = record is not None and not record.concurrent and record.decision in (Decision.ADMITTED,
                                                                                        Decision.CLAMPED)
            self.pairs[t._trial_id] = {
                r: (getattr(record, f"peak_{r}"), getattr(record, f"pred_{r}")) for r in RESOURCES
                if ran and getattr(record, f"pred_{r}") and getattr(record, f"peak_{r}") is not None}
        return {r: learned_margin(p[r] for p in self.pairs.values() if r in p) for r in RESOURCES}

    def _admit(self) -> None:
        from ..ledger import describe

        waiting = self.waiting
        assert waiting is not None
        ledger, request = self.ledger, waiting.request
        misfit = ledger.misfit(request)
        if misfit:
            self.waiting = None
            self._end_rejected(waiting.trial, waiting.state,
                               reason=f"its reservation can never fit host {ledger.host}: {misfit}")
            return
        key = json.dumps({"storage": self.storage_id, "study": self.study.study_name,
                          "trial_id": waiting.trial._trial_id,
                          "number": waiting.trial.number, "decision": waiting.state.decision.value})
        entry = ledger.try_admit(request, key)
        self._fail_reaped(ledger.take_reaped())
        if entry is None:
            if self.on_host_full == "reject":
                self.waiting = None
                self._end_rejected(waiting.trial, waiting.state, reason=(
                    f"the host was full: its reservation ({describe(request)}) did not fit beside the running "
                    f"trials' ({describe(ledger.in_use())}) in {describe(ledger.capacity)}"))
            return
        self.waiting = None
        waited = time.monotonic() - waiting.since
        if waited > 1.0:
            _logger.info("Trial %d waited %.1f s for its reservation on %s.", waiting.trial.number, waited,
                         ledger.host)
        self._launch(waiting, entry)

    def _launch(self, waiting: _Waiting, entry: "Entry") -> None:
        trial, state = waiting.trial, waiting.state
        payload = _Payload(
            objective=self.objective, storage=self.study._storage, study_name=self.study.study_name,
            trial_id=trial._trial_id, assignment=dict(state.assignment), space=dict(state.space),
            sampler=self.base_sampler, pruner=self.inner_pruner, gpu=entry.gpu,
            environ=dict(os.environ), cwd=os.getcwd(),
        )
        receive, send = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(target=_child_main, args=(payload, send), name=f"memprune-trial-{trial.number}")
        try:
            process.start()
        except Exception as exc:
            receive.close()
            self.ledger.release(entry)
            reason = f"the trial could not be started in its own process: {type(exc).__name__}: {exc}"
            self._fail_before_launch(trial, state, reason)
            if "pickle" in str(exc).lower() or isinstance(exc, (TypeError, AttributeError)):
                raise TypeError(f"{reason}. optimize() needs a picklable objective: a module-level function "
                                "or a functools.partial of one.") from exc
            raise
        finally:
            send.close()
        child = _Child(self, waiting, entry, process, receive)
        self.children[trial._trial_id] = child
        child.watch()
        if self.heartbeats:
            child.heartbeat = optuna.storages._heartbeat.get_heartbeat_thread(trial._trial_id, self.study._storage)
            child.heartbeat.start()

    # -- after a trial -----------------------------------------------------------------------------

    def _reap_finished(self) -> None:
        for trial_id, child in list(self.children.items()):
            if child.result is None and child.conn.poll():
                try:
                    child.result = child.conn.recv()
                except (EOFError, OSError):
                    child.result = ("lost",)
                except Exception as exc:  # noqa: BLE001 - an exception that does not unpickle
                    child.result = ("fail", None, f"the trial's result could not be read: {exc}", "", False, 0)
            if child.process.is_alive():
                continue
            child.ended = time.monotonic()
            child.process.join()
            if child.result is None and child.conn.poll():
                try:
                    child.result = child.conn.recv()
                except Exception:  # noqa: BLE001
                    child.result = None
            del self.children[trial_id]
            try:
                self._finish(child)
            finally:
                child.close()
                self.ledger.release(child.entry)

    def _finish(self, child: _Child) -> None:
        guard, trial = self.guard, child.trial
        result = child.result if child.result and child.result[0] != "lost" else None
        peak = child.monitor.peak if child.monitor is not None else None
        child_hwm = result[-1] if result else 0
        if result and result[-2]:  # the objective called trial.study.stop()
            self.study._stop_flag = True
        peaks = {"ram": max(peak.rss if peak else 0, child_hwm) or None,
                 "vram": peak.vram if peak else None, "threads": peak.threads if peak else None}
        decision, values, failure = None, None, None
        state = TrialState.FAIL
        if child.hard_reading is not None and (result is None or result[0] != "complete"):
            decision, state = Decision.STOPPED, TrialState.PRUNED
            reason = f"stopped by the runner: {_breach(guard, child.hard_reading, 1.0)}"
        elif result is None:
            code = child.process.exitcode
            reason = (f"its process died from signal {signal.Signals(-code).name}" if code is not None and code < 0
                      else f"its process exited with code {code} without a result")
            if code == -signal.SIGKILL:
                reason += " (sent from outside the runner: the kernel's OOM killer sends SIGKILL)"
            reason = f"{child.state.reason}; {reason}"
        elif result[0] == "complete":
            state, values, reason = TrialState.COMPLETE, result[1], None
            if child.hard_reading is not None:
                reason = (f"{child.state.reason}; crossed the budget ({_breach(guard, child.hard_reading, 1.0)}) "
                          "but the objective ended first")
        elif result[0] == "pruned":
            state, reason = TrialState.PRUNED, None
            if result[2]:
                decision = Decision.SOFT_PRUNED
                reason = f"pruned at the soft line: {_breach(guard, child.soft_reading, guard._soft)}"
        else:  # "fail"
            exc, text, tb = result[1], result[2], result[3]
            reason = f"{child.state.reason}; the objective raised {text}"
            caught = exc is not None and isinstance(exc, self.catch)
            failure = None if caught else (exc if isinstance(exc, BaseException) else RuntimeError(text))
            if failure is not None and tb:
                _logger.error("Trial %d failed in its process:\n%s", trial.number, tb)
        breach = (child.soft_reading if decision is Decision.SOFT_PRUNED
                  else child.hard_reading or child.soft_reading)
        frozen = _retry("reading the trial", lambda: self.study._storage.get_trial(trial._trial_id))
        timeline = child.monitor.timeline() if child.monitor is not None else []
        record = guard._record(child.state, frozen.params, decision=decision, reason=reason, peaks=peaks,
                               timeline=timeline, breach=breach)
        # the margin its reservation applied; a trial unchecked at launch reserved the budget instead
        budgeted = ({r: m for r, m in child.margins.items() if r in guard._budget.resources}
                    if child.reserved_prediction else {})
        record = dataclasses.replace(record, margin=budgeted, host=self.ledger.host, gpu=child.entry.gpu)
        if decision is Decision.STOPPED and child.hard_reading is not None:  # crossing reading -> tree gone
            stop_ms = round((child.ended - child.hard_reading.t) * 1000, 1)
            record = dataclasses.replace(record, breach={**record.breach, "stop_ms": stop_ms})
        self._end(trial, child.state, record, state, values)
        if failure is not None and self.fatal is None:
            self.fatal = failure

    def _end(self, trial: optuna.Trial, state: _TrialState, record: _records.TrialRecord,
             final: TrialState, values: Any = None) -> None:
        """Write the record, then the final state, then run the callbacks."""
        try:
            _retry("writing the record", lambda: _records.write_frozen(self.study, trial._trial_id, record))
        except Exception:  # noqa: BLE001 - the final state matters more than the record
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        finally:
            self.guard._close(trial._trial_id)
        if final is TrialState.COMPLETE:
            _retry("telling the result", lambda: self.study.tell(trial, values, skip_if_finished=True))
        else:
            _retry("telling the result", lambda: self.study.tell(trial, state=final, skip_if_finished=True))
        frozen = self.study._storage.get_trial(trial._trial_id)
        key = {TrialState.COMPLETE: "done", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}[frozen.state]
        self.counts[key] += 1
        if record.decision is Decision.REJECTED:
            self.counts["rejected"] += 1
        _logger.info("Trial %d finished %s (%s): %s", trial.number, frozen.state.name, record.decision.value,
                     record.reason)
        for callback in self.callbacks:
            callback(self.study, frozen)

    def _end_rejected(self, trial: optuna.Trial, state: _TrialState, *, reason: str | None = None) -> None:
        if reason is not None:
            state.decision, state.reason = Decision.REJECTED, reason
        try:
            store_rejection(self.guard, trial, state, decision=Decision.REJECTED, reason=state.reason)
        except Exception:  # noqa: BLE001 - the trial still ends PRUNED
            _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
        _retry("telling the result", lambda: self.study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True))
        self.counts["rejected"] += 1
        self.counts["pruned"] += 1
        frozen = self.study._storage.get_trial(trial._trial_id)
        for callback in self.callbacks:
            callback(self.study, frozen)

    def _fail_before_launch(self, trial: optuna.Trial, state: _TrialState, reason: str) -> None:
        record = self.guard._record(state, {}, reason=reason)
        self._end(trial, state, record, TrialState.FAIL)

    def _fail_reaped(self, entries: Iterable["Entry"]) -> None:
        """Fail the trials of reservations whose runner died (their processes died with it): those of any
        study in this runner's storage; for another storage only a warning can be given."""
        for entry in entries:
            try:
                key = json.loads(entry.key)
                trial_id, name = int(key["trial_id"]), str(key["study"])
            except (ValueError, KeyError, TypeError):
                continue
            if key.get("storage") != self.storage_id:
                _logger.warning("The runner of trial %s of study %r (pid %d) died; its study is in another "
                                "storage, which only its own runners (or heartbeats) can fail it in.",
                                key.get("number"), name, entry.owner_pid)
                continue
            study = self.study if name == self.study.study_name else optuna.Study(name, self.study._storage)
            frozen = _retry("reading the trial", lambda: study._storage.get_trial(trial_id))
            if frozen.state is not TrialState.RUNNING:
                continue
            reason = (f"its runner (pid {entry.owner_pid} on host {entry.host}) died while the trial ran; "
                      f"reaped by pid {os.getpid()}")
            record = _records.TrialRecord(decision=Decision(key.get("decision", "unchecked")), reason=reason,
                                          host=entry.host, gpu=entry.gpu,
                                          **{f"budget_{r}": getattr(self.guard._budget, r) for r in RESOURCES})
            _retry("writing the record", lambda: _records.write_frozen(study, frozen._trial_id, record))
            _retry("failing the trial", lambda: study.tell(frozen.number, state=TrialState.FAIL,
                                                              skip_if_finished=True))
            _logger.warning("Trial %d failed: %s", frozen.number, reason)

    def _abort(self) -> None:
        """The runner itself is ending abnormally (Ctrl-C, an error): stop every child, fail its trial."""
        for child in list(self.children.values()):
            child.stop(signal.SIGKILL)
        for child in list(self.children.values()):
            child.process.join(5)
            try:
                record = self.guard._record(child.state, {}, reason=f"{child.state.reason}; the runner stopped "
                                            "(interrupted or failed) while the trial ran")
                self._end(child.trial, child.state, record, TrialState.FAIL)
            except Exception:  # noqa: BLE001 - best effort: the next runner reaps what is left
                _logger.exception("Trial %d: could not be failed", child.trial.number)
            finally:
                child.close()
                self.ledger.release(child.entry)
        self.children.clear()
        if self.waiting is not None:
            try:
                self._fail_before_launch(self.waiting.trial, self.waiting.state,
                                         "the runner stopped while the trial waited for its reservation")
            except Exception:  # noqa: BLE001
                _logger.exception("Trial %d: could not be failed", self.waiting.trial.number)
            self.waiting = None


def _retry(what: str, call: Callable[[], Any]) -> Any:
    """``call()``, retried with backoff on storage errors; each failure is logged, the last raised."""
    import sqlalchemy.exc

    errors = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError,
              sqlalchemy.exc.InterfaceError)
    for attempt in range(_RETRIES):
        try:
            return call()
        except errors as exc:
            if attempt == _RETRIES - 1:
                raise
            delay = 0.1 * 2 ** attempt
            _logger.warning("Storage error while %s (attempt %d of %d, retrying in %.1f s): %s",
                            what, attempt + 1, _RETRIES, delay, exc)
            time.sleep(delay)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _storage_id(storage: Any) -> str | None:
    """A short fingerprint of where a storage keeps its data (so a ledger entry can name it without
    holding its URL, which may carry a password); None where there is nothing stable to name."""
    import hashlib

    backend = getattr(storage, "_backend", storage)
    where = getattr(backend, "url", None)
    if where is None:
        where = getattr(getattr(backend, "_backend", None), "_file_path", None)  # JournalFileBackend
    return None if where is None else hashlib.sha1(str(where).encode()).hexdigest()[:16]


_SERVERS: dict[str, Any] = {}


def _fork_server(objective: Callable) -> Any:
    """The forkserver context of this process (one server, started on first use with the preloads)."""
    ctx = multiprocessing.get_context("forkserver")
    if not _SERVERS:
        import importlib.util

        main = sys.modules.get("__main__")
        preload = [m for m in _PRELOAD if importlib.util.find_spec(m.split(".")[0]) is not None]
        preload += [m for m in _PRELOAD_IF_LOADED if m in sys.modules]
        module = getattr(objective, "__module__", None) or getattr(getattr(objective, "func", None), "__module__", None)
        if module and module != "__main__":
            preload.append(module)
        elif getattr(main, "__file__", None):
            preload.append("__main__")  # a script's objective: imported once by the server, not per trial
        ctx.set_forkserver_preload(preload)
        _SERVERS["ctx"] = ctx
    return _SERVERS["ctx"]


def _stop_fork_server() -> None:
    """Stop the fork server once ``optimize`` returns: a process of several hundred MiB (torch preloaded)
    must not outlive the call, nor count in the readings of an in-process guard of this process later."""
    from multiprocessing import forkserver

    if _SERVERS.pop("ctx", None) is not None:
        try:
            forkserver._forkserver._stop()
        except Exception:  # noqa: BLE001 - already gone
            _logger.debug("stopping the fork server failed", exc_info=True)


# -- the child -------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Payload:
    objective: Callable
    storage: Any
    study_name: str
    trial_id: int
    assignment: dict[str, Any]
    space: dict[str, Any]
    sampler: BaseSampler
    pruner: Any
    gpu: int | None
    environ: dict[str, str]   # the runner's, now: the fork server was started with an older copy
    cwd: str


class _Served(BaseSampler):
    """The child's sampler: the checked assignment as relative params, the base sampler for the rest."""

    def __init__(self, base: BaseSampler, assignment: dict[str, Any], space: dict[str, Any]) -> None:
        self._base, self._assignment, self._space = base, assignment, space

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return dict(self._space)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        return {n: self._assignment[n] for n in search_space if n in self._assignment}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self._base.sample_independent(study, trial, name, distribution)


class _Signalled(optuna.pruners.BasePruner):
    """The child's pruner: True once the runner signalled the soft line, else the user's pruner."""

    crossed = False
    answered = False

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def prune(self, study: Any, trial: Any) -> bool:
        if _Signalled.crossed:
            _Signalled.answered = True
            return True
        return False if self._inner is None else self._inner.prune(study, trial)


def _child_main(payload: _Payload, conn: Any) -> None:
    _die_with_parent()
    signal.signal(_SOFT_SIGNAL, lambda *_: setattr(_Signalled, "crossed", True))
    os.environ.clear()
    os.environ.update(payload.environ)
    os.chdir(payload.cwd)
    if payload.gpu is not None:  # the ledger's indices are NVML's, which follow the PCI bus order
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = str(payload.gpu)
    payload.sampler.reseed_rng()  # every child starts from the parent's copy of the rng
    study = optuna.Study(payload.study_name, payload.storage,
                         sampler=_Served(payload.sampler, payload.assignment, payload.space),
                         pruner=_Signalled(payload.pruner))
    trial = optuna.Trial(study, payload.trial_id)
    study._thread_local.in_optimize_loop = True  # trial.study.stop() works here as under Study.optimize
    try:
        value = payload.objective(trial)
    except optuna.TrialPruned as exc:
        message: tuple = ("pruned", str(exc), _Signalled.answered)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        message = ("fail", _picklable(exc), f"{type(exc).__name__}: {exc}", traceback.format_exc())
    else:
        message = ("complete", _values(value))
    conn.send((*message, study._stop_flag, _max_rss()))
    conn.close()


def _values(value: Any) -> Any:
    """The objective's value(s) as floats where possible (the parent's ``tell`` validates them)."""
    try:
        return [float(v) for v in value] if isinstance(value, Sequence) else float(value)
    except (TypeError, ValueError):
        return None


def _picklable(exc: BaseException) -> BaseException | None:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return None


def _max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the fork server) exits, which it does when the
    runner that started it dies; a trial never outlives its runner.

    The server exits once no process holds the write end of its "alive" pipe; multiprocessing hands
    that end to every child too, which would keep the server (and so the trial) alive after the runner
    died. The child lets go of it: a fork server the objective itself needs is then started afresh,
    as it would be anyway (a forked child never reuses its parent's server).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is None and server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        server._forkserver_address = None
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass
