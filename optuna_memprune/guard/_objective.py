"""GuardedObjective: runs the user's objective under the monitor, rejects, stops and writes the record.

Owns the in-process hard stop (an exception raised in the trial's thread); knows nothing of how the
assignment was checked or clamped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from .. import _internals, records
from ..monitor import Monitor, Reading, downsample
from ..records import Decision
from ._forecast_stop import StepForecast, trial_forecast
from ._interrupt import importing, set_async_exc
from ._oom import OutOfMemory, out_of_memory, release, reset_cuda_peak, with_cuda_peak
from ._outcome import Outcome, trial_outcome
from ._peak_rss import peak_rss
from ._policy import check_guard
from ._start import ProcessLevels, allowance, charged, describe_allowance, trim_heap
from ._trials import TrialGuardState

if TYPE_CHECKING:
    from ._policy import Guard, Policy

_logger = logging.getLogger("optuna_memprune.guard")

_TIMELINE_POINTS = 200  # points of the record's timeline
_KEEP_POINTS = 512  # points a running trial keeps before halving them (as Monitor does)
_IDLE_READINGS = 10  # the shared monitor stops after this many readings with no trial running


class MemoryBudgetExceeded(optuna.TrialPruned):
    """The trial's process crossed its budget while the trial ran; the trial ends PRUNED.

    ``reading`` is the monitor's reading that crossed (a ``optuna_memprune.monitor.Reading``).
    An objective that catches ``Exception`` around its training loop swallows it; let
    ``optuna.TrialPruned`` through.
    """

    def __init__(self, message: str = "", reading: Reading | None = None) -> None:
        super().__init__(message)
        self.reading = reading

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.reading))


class _Interrupt(MemoryBudgetExceeded):
    """Raised asynchronously in the trial's thread (by class, without arguments); re-raised as its base."""


class GuardedObjective:
    """The user's objective run under the guard; what ``MemoryGuard.wrap_objective`` returns.

    For each trial it first has the guarded sampler check the trial's assignment (``trial.relative_params``
    runs the lookahead before any of the objective's code). A rejected trial gets every param of the known
    space suggested from the checked assignment, its record, and ends PRUNED without calling the objective.
    Otherwise the guard's :class:`~optuna_memprune.monitor.Monitor` of this process (one per guard, shared
    by its running trials, started with the first and stopped once idle) reads it every
    ``monitor_interval`` seconds while the objective runs. A reading over the soft line makes the guarded
    pruner answer True; a reading over the budget raises :class:`MemoryBudgetExceeded` in the trial's
    thread at its next Python bytecode, which ends the trial PRUNED with the reading. The record is written
    before Optuna stores the trial's final state, and heap memory the trial freed is given back to the OS
    (glibc ``malloc_trim``) so the next trial's readings start from what is really in use.

    Trials here share one process, so its readings include what earlier trials left behind. Before the
    sampler checks a trial, what can be given back is (garbage collected, free heap trimmed, torch's CUDA
    cache emptied where CUDA is initialised; after a trial that left something), then the process's usage is
    read: the record's ``start_*``, so ``peak_* - start_*`` is the trial's own increment. A learned increment
    is admitted on that usage plus the increment; a footprint function's whole-process figure alone. A trial
    is never stopped or rejected for what earlier trials left: where that makes the budget unreachable, the
    trial is held to its budget on its own memory (its lines raised by what was left), the guard warns once
    and the record says so (``guard/_start.py`` has the rules).

    Notes:
        - The interrupt cannot land after the objective returned: it is cleared under a lock before the
          wrapper leaves its guarded region, and one that lands earlier is turned into the PRUNED end.
        - A thread blocked in one long C call (a single huge allocation, ``time.sleep``) takes the
          exception when the call returns; process-per-trial mode can kill such a trial, in-process can't.
        - ``study.optimize(n_jobs>1)`` runs trials as threads of one process: the guard warns once, the
          budget applies to the process as a whole, and a breach stops every guarded trial running in it.
        - An objective that catches ``Exception`` around its loop swallows the interrupt (it is an
          ``optuna.TrialPruned``); the record then says so, and ``trial.should_prune()`` still answers True.
        - An objective that runs out of memory (``MemoryError``, numpy's "Unable to allocate", torch's
          ``OutOfMemoryError``) ends PRUNED, decision ``out_of_memory``, with a positive constraint on the
          resource that ran out, whatever ``catch`` says; its frames' locals are dropped and, where it runs
          torch on CUDA, torch's cache is emptied. With torch on CUDA, ``torch.cuda.max_memory_reserved()``
          (reset at the trial's start) counts in the trial's VRAM peak.

    Example:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram="1GiB"), omp.Budget(ram="64GiB"))
        >>> study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
        >>> study.optimize(guard.wrap_objective(lambda t: t.suggest_float("x", 0, 1)), n_trials=2)
    """

    def __init__(self, objective: Callable[[optuna.Trial], Any], guard: Guard) -> None:
        if not callable(objective):
            raise TypeError(f"objective must be callable, but got {type(objective).__name__}.")
        check_guard(guard)
        self._objective = objective
        self._guard = guard
        functools.update_wrapper(self, objective)

    def __call__(self, trial: optuna.Trial) -> Any:
        guard = self._guard
        state = guard.trials.open(_internals.trial_id(trial), trial.number)
        state.enforced = True
        _read_start(guard, state)
        try:
            _ = trial.relative_params  # the guarded sampler's lookahead, before any of the objective's code
        except Exception:
            try:
                if state.sampled:  # the footprint's error with on_footprint_error="raise": say so on the trial
                    records.write(trial, guard.policy.record(state, trial.params, repredict=False))
            except Exception:  # the original error matters more
                _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
            guard.trials.close(state.trial_id)
            raise  # a configuration error (unknown clamp name), the footprint's, or the base sampler's own
        if not state.sampled:
            guard.warnings.once(
                "unguarded-sampler",
                "study.sampler is not guard.wrap_sampler(...): trials run unchecked, under the monitor only.",
            )
            state.uncheck("the study's sampler is not wrapped by this guard")
        if state.decision is Decision.REJECTED:
            self._reject(trial, state)
        return self._run(trial, state)

    def _reject(self, trial: optuna.Trial, state: TrialGuardState) -> None:
        store_rejection(self._guard, trial, state)
        raise optuna.TrialPruned(f"memprune rejected the trial before launch: {state.reason}")

    def _run(self, trial: optuna.Trial, state: TrialGuardState) -> Any:
        guard, policy = self._guard, self._guard.policy
        if guard.trials.enter_run(state) == 1:
            reset_cuda_peak()  # where the objective runs torch on CUDA: its peak is this trial's
        else:
            guard.warnings.once(
                "n_jobs",
                "Trials run as threads of one process (study.optimize(n_jobs>1)): the guard budgets the "
                "process as a whole, and a breach stops every guarded trial running in it. Use "
                "optuna_memprune.optimize(..., n_jobs=k) for one process per trial.",
            )
        if state.allowance:
            words = describe_allowance(policy, state)
            state.reason = f"{state.reason}; {words}"
            guard.warnings.once(
                "leftover", f"Trial {trial.number}: {words}. Said once; each such trial's record says so."
            )
        forecast = trial_forecast(guard, trial.storage, state)
        if forecast is not None:
            forecast.limit += state.allowance.get("ram", 0)
        live = _Live(guard, state, threading.get_ident(), forecast)
        own: dict[str, int] | None = None  # the trial's increments, where it ran to the end alone
        watch = watch_of(guard)
        stopped = soft_pruned = returned = False
        oom: OutOfMemory | None = None
        try:
            try:
                watch.subscribe(live, trial.number)
                value = self._objective(trial)
                returned = True
                return value
            finally:
                live.disarm()
        except _Interrupt as interrupt:
            live.disarm()  # the only interrupt of this trial was delivered: this call completes
            stopped = True
            reason = _outcome(policy, state, stopped=True, forecast=live.forecast_reason()).reason
            # Drop the objective's frames now: Optuna keeps the exception in a reference cycle until the
            # next garbage collection, and with it every array the objective held.
            interrupt.__traceback__ = None
            raise MemoryBudgetExceeded(f"memprune {reason}", state.hard_reading) from None
        except optuna.TrialPruned as pruned:
            soft_pruned = state.soft_answered
            raise pruned.with_traceback(None) from None  # as above; Optuna logs a pruned trial's message only
        except Exception as exc:
            oom = out_of_memory(exc)
            if oom is None:
                raise
            oom = oom.measured_here()
            release(exc)  # its frames' arrays and torch's cached CUDA blocks: the next trial starts clean
            raise optuna.TrialPruned(f"memprune: {oom.describe(policy.budget)}") from None
        finally:
            try:
                watch.unsubscribe(live)
                end = _outcome(
                    policy,
                    state,
                    stopped=stopped,
                    soft_pruned=soft_pruned,
                    out_of_memory=oom,
                    forecast=live.forecast_reason() if stopped else None,
                )
                if state.allowance and end.reason is not None and end.reason != state.reason:
                    end = end._replace(reason=f"{end.reason} (its lines raised by what earlier trials left)")
                peaks = with_cuda_peak(live.peaks())
                if returned and state.hard_reading is None and state.start is not None and not state.concurrent:
                    own = {
                        r: v - state.start[r]
                        for r, v in peaks.items()  # type: ignore[operator]
                        if v is not None and state.start.get(r) is not None
                    }
                peaks = oom.needs(peaks, policy.budget) if oom is not None else peaks
                record = policy.record(
                    state,
                    trial.params,
                    decision=end.decision,
                    reason=end.reason,
                    peaks=peaks,
                    timeline=live.timeline(),
                    breach=end.breach,
                )
                if end.decision is Decision.FORECAST_STOPPED and live.forecast is not None:
                    record = dataclasses.replace(record, forecast=live.forecast.record())
                records.write(trial, record)
            except Exception:  # bookkeeping must not change how the trial ends
                _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
            finally:
                guard.trials.exit_run(state)
                guard.trials.close(state.trial_id)
                if live.grew():
                    trim_heap()
                watch.levels.ended(state.start, own)  # the next start gives back first where this trial left any


def _read_start(guard: Guard, state: TrialGuardState) -> None:
    """The process's usage at the trial's start, after the give-back (``guard/_start.py``), on the trial's
    state before the guarded sampler checks it; a failure leaves the trial as if it had its own process."""
    try:
        watch = watch_of(guard)
        # the guard's monitor thread counts in every reading while a trial runs, the footprint's worker in
        # none: so in the start level
        own = (0 if watch.watching else 1) - guard.policy.own_threads
        start = watch.levels.start(alone=not guard.trials.running(), threads=own)
    except Exception as exc:  # noqa: BLE001 - the guard's own failure never stops a trial
        _logger.warning("Trial %d: reading the process's usage at the start failed: %s", state.number, exc)
        return
    state.start, state.allowance = start.level, allowance(guard.policy, start)


def store_rejection(guard: Guard, trial: optuna.Trial, state: TrialGuardState, **record: Any) -> None:
    """Store every param of the known space from the checked assignment (a PRUNED trial with a partial
    set shrinks TPE's joint search space) and the record of a trial that will not run; the caller ends
    it PRUNED. ``record`` overrides fields of the record (decision, reason)."""
    try:
        for name, dist in state.space.items():
            _suggest(trial, name, dist)
    except Exception as exc:  # noqa: BLE001 - the trial still ends PRUNED, with what was stored
        _logger.warning("Trial %d: storing the rejected params failed: %s", trial.number, exc)
    try:
        records.write(trial, guard.policy.record(state, trial.params, **record))
    finally:
        guard.trials.close(state.trial_id)


def _outcome(
    policy: Policy,
    state: TrialGuardState,
    *,
    stopped: bool = False,
    soft_pruned: bool = False,
    out_of_memory: OutOfMemory | None = None,
    forecast: str | None = None,
) -> Outcome:
    """How an in-process trial ended: stopped by the interrupt (at the budget or on the forecast), out of
    memory, pruned at the soft line, or on its own."""
    return trial_outcome(
        policy,
        state.reason,
        soft_reading=state.soft_reading,
        hard_reading=state.hard_reading,
        stopped_by="in process" if stopped else None,
        soft_pruned=soft_pruned,
        out_of_memory=out_of_memory,
        ended_first="the objective ended first or caught the interrupt",
        forecast=forecast,
    )


class _Live:
    """The monitor's side of one trial: its readings, soft and hard crossings, the one interrupt."""

    def __init__(
        self, guard: Guard, state: TrialGuardState, thread_id: int, forecast: StepForecast | None = None
    ) -> None:
        self._policy = guard.policy
        self.forecast = forecast
        self._state = state
        self._thread_id = thread_id
        self._lock = threading.Lock()
        self._armed = True
        self._fired = False
        self._deferred = False  # an interrupt due while the trial's thread imported a module
        self._start = time.monotonic()
        self._hwm0 = peak_rss()  # this process's peak RSS so far: a rise above it happened in the trial
        self._base = charged(guard.policy, state)  # the soft line's margin is on the room above it
        self._peak: Reading | None = None
        self._points: list[tuple[float, int, int, int | None]] = []

    def on_reading(self, reading: Reading) -> None:
        """Called from the monitor's thread for every reading while the trial runs."""
        if reading.t < self._start:  # taken before this trial began (while an earlier one ran)
            return
        own = self._policy.own_threads  # the footprint's worker, lingering after the sampler's check
        if own:
            reading = reading._replace(threads=max(reading.threads - own, 0))
        with self._lock:
            self._peak = reading if self._peak is None else _max_reading(self._peak, reading)
            self._points.append((reading.t, reading.rss, reading.threads, reading.vram))
            if len(self._points) >= _KEEP_POINTS:
                self._points = downsample(self._points, _KEEP_POINTS // 2)
        state, policy = self._state, self._policy
        if state.soft_reading is None and policy.over(reading, policy.soft, state.allowance, self._base):
            state.soft_reading = reading
        if state.hard_reading is None and policy.over(reading, 1.0, state.allowance):
            state.hard_reading = reading
            self._fire()
        elif self.forecast is not None and self.forecast.on_reading(reading.t, reading.rss) is not None:
            self._fire()  # projected over the budget at the trial's last step
        elif self._deferred:
            self._fire()  # an import ran when it was due: at the first reading after it

    def forecast_reason(self) -> str | None:
        """The reason of the forecast stop, ``None`` when the forecast stopped nothing."""
        return None if self.forecast is None else self.forecast.reason()

    def _fire(self) -> None:
        """Interrupt the trial's thread, unless it is importing a module now: an exception there would leave
        a package half-imported in ``sys.modules`` for every later trial of the process (torch's optimizer
        importing ``torch._dynamo`` and sympy, stopped midway, broke every later trial). Then it waits for the
        next reading (``_deferred``)."""
        with self._lock:
            if self._armed and not self._fired:
                self._deferred = importing(self._thread_id)
                if not self._deferred:
                    set_async_exc(self._thread_id, _Interrupt)
                    self._fired = True

    def disarm(self) -> None:
        """No interrupt can reach the trial's thread once this returns (an undelivered one is cleared)."""
        with self._lock:
            self._armed = False
            if self._fired:
                set_async_exc(self._thread_id, None)

    def grew(self) -> bool:
        """Whether the trial ran for at least one reading or raised the process's peak RSS: only then may
        it have left freed heap behind worth trimming."""
        with self._lock:
            return self._peak is not None or peak_rss() > self._hwm0

    def peaks(self) -> dict[str, int | None]:
        """The trial's highest ``ram``, ``vram`` and ``threads`` (``None``: no reading in the trial).

        ``ram`` is also raised to this process's peak RSS (VmHWM, from ``getrusage``) when that rose during
        the trial: it catches a spike between two readings, even in a trial shorter than one interval.
        """
        with self._lock:
            peak = self._peak
        hwm = peak_rss()
        ram = None if peak is None else peak.rss
        if hwm > self._hwm0:
            ram = hwm if ram is None else max(ram, hwm)
        return {
            "ram": ram,
            "vram": None if peak is None else peak.vram,
            "threads": None if peak is None else peak.threads,
        }

    def timeline(self) -> list[tuple[float, int, int, int | None]]:
        """``(t_s, rss, threads, vram)`` since the trial started, downsampled keeping each column's maxima."""
        with self._lock:
            points = downsample(self._points, _TIMELINE_POINTS)
        return [(round(max(t - self._start, 0.0), 3), rss, threads, vram) for t, rss, threads, vram in points]


class _Watch:
    """One Monitor of this process per guard, shared by the guard's running trials, and their start levels.

    Started by the first trial, kept across trials (a trial pays no thread start), stopped by its own thread
    after ``_IDLE_READINGS`` readings without a trial. With ``n_jobs>1`` every running trial gets every
    reading of the one process.
    """

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self.levels = ProcessLevels()  # the trials' start levels in this process
        self._lock = threading.Lock()
        self._monitor: Monitor | None = None
        self._lives: dict[int, _Live] = {}
        self._idle = 0

    def subscribe(self, live: _Live, number: int) -> None:
        """Watch ``live``'s trial from the monitor's next reading on (started here if none runs)."""
        try:
            with self._lock:
                if self._monitor is None:
                    # no timeline of its own (each trial keeps its points): it lives across trials
                    self._monitor = Monitor(
                        interval=self._interval, on_reading=self._on_reading, max_timeline=0
                    ).start()
                self._lives[id(live)] = live
                self._idle = 0
        except _Interrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - a trial without readings still runs
            _logger.warning("Trial %d: the monitor could not start (%s); it runs unwatched.", number, exc)

    @property
    def watching(self) -> bool:
        """Whether the monitor's thread runs now."""
        with self._lock:
            return self._monitor is not None

    def unsubscribe(self, live: _Live) -> None:
        with self._lock:
            self._lives.pop(id(live), None)

    def _on_reading(self, reading: Reading) -> None:
        with self._lock:
            lives = list(self._lives.values())
            if not lives:
                self._idle += 1
                if self._idle >= _IDLE_READINGS and self._monitor is not None:
                    monitor, self._monitor = self._monitor, None
                    monitor.stop()  # from the monitor's own thread: returns at once, the thread ends
                return
        for live in lives:
            try:
                live.on_reading(reading)
            except Exception:  # one trial's bookkeeping must not starve the others
                _logger.exception("memprune: handling a reading failed")


_WATCHES_LOCK = threading.Lock()
# The guard's one Watch, kept beside its trial registry (both are per guard and per process) for as long as
# the guard lives: an unpickled guard gets a registry, and so a Watch, of its own.
_WATCHES: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()


def watch_of(guard: Guard) -> _Watch:
    """The guard's shared monitor of this process (created on first use)."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get(guard.trials)
        if watch is None:
            watch = _WATCHES[guard.trials] = _Watch(guard.policy.interval)
        return watch


def _max_reading(a: Reading, b: Reading) -> Reading:
    def top(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else max(x, y)

    return Reading(
        t=b.t if b.rss > a.rss else a.t,
        rss=max(a.rss, b.rss),
        hwm=max(a.hwm, b.hwm),
        threads=max(a.threads, b.threads),
        processes=max(a.processes, b.processes),
        pss=top(a.pss, b.pss),
        vram=top(a.vram, b.vram),
    )


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """``trial.suggest_*`` for a stored distribution, through the public API."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise TypeError(f"unsupported distribution {type(dist).__name__} for param {name!r}")
