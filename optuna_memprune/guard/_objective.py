"""GuardedObjective: runs the user's objective under the monitor, rejects, stops and writes the record.

Owns a trial's run in this process, from its start level to its record, and the storing of a rejected trial;
the readings, crossings and the interrupt that stops a trial are ``_watch.py``'s. Knows nothing of how the
assignment was checked or clamped.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
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
from ..records import Decision
from ._core import check_guard, policy_of, trials_of, warnings_of
from ._forecast_stop import trial_forecast
from ._oom import OutOfMemory, out_of_memory, release, reset_cuda_peak, with_cuda_peak
from ._outcome import Outcome, trial_outcome
from ._start import (
    allowance,
    describe_allowance,
    describe_full,
    leftover,
    reset_rss_peak,
    set_aside,
    trim_heap,
)
from ._trials import TrialGuardState
from ._watch import Interrupt, Live, MemoryBudgetExceeded, watch_of

if TYPE_CHECKING:
    from ._core import Guard
    from ._policy import Policy

_logger = logging.getLogger("optuna_memprune.guard")


class GuardedObjective:
    """The user's objective run under the guard; what ``MemoryGuard.wrap_objective`` returns.

    For each trial it first has the guarded sampler check the trial's assignment (``trial.relative_params``
    runs the lookahead before any of the objective's code). A rejected trial gets every param of the known
    space suggested from the checked assignment, its record, and ends PRUNED without calling the objective.
    Otherwise the guard's ``Monitor`` of this process (one per guard, shared
    by its running trials, started with the first and stopped once idle) reads it every
    ``monitor_interval`` seconds while the objective runs. A reading over the soft line makes the guarded
    pruner answer True; a reading over the budget raises ``MemoryBudgetExceeded`` in the trial's
    thread at its next Python bytecode, which ends the trial PRUNED with the reading. The record is written
    before Optuna stores the trial's final state, and heap memory the trial freed is given back to the OS
    (glibc ``malloc_trim``) so the next trial's readings start from what is really in use.

    Trials here share one process, so its readings include what earlier trials left behind. Before the
    sampler checks a trial, what can be given back is (garbage collected, free heap trimmed, torch's CUDA
    cache emptied where CUDA is initialised; after a trial that left something), then the process's usage is
    read: the record's ``start_*``, so ``peak_* - start_*`` is the trial's own increment. A learned increment
    is admitted on that usage plus the increment; a footprint function's whole-process figure alone. A trial
    is never stopped or rejected for what earlier trials left: where that makes the budget unreachable, or
    the trial would not fit beside it, the trial is held to its budget on its own memory (its lines raised
    by what was left), the guard warns once and the record says so (``guard/_start.py`` has the rules).

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
        - A trial alone in the process resets the process's peak RSS (VmHWM, where Linux allows) at its
          start, so that the peak read at its end is its own, even in a trial shorter than one reading that
          stays under an earlier trial's peak; a program that reads its own VmHWM (or ``ru_maxrss``, where
          its ``exec`` left that lower) sees the last trial's peak.

    Examples:
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
        trials = trials_of(guard)
        state = trials.open(_internals.trial_id(trial), trial.number)
        state.enforced = True
        _read_start(guard, state)
        try:
            _ = trial.relative_params  # the guarded sampler's lookahead, before any of the objective's code
        except Exception:
            try:
                if state.sampled:  # the footprint's error with on_footprint_error="raise": say so on the trial
                    records.write(trial, policy_of(guard).record(state, trial.params, repredict=False))
            except Exception:  # the original error matters more
                _logger.exception("Trial %d: writing the memprune record failed.", trial.number)
            trials.close(state.trial_id)
            raise  # a configuration error (unknown clamp name), the footprint's, or the base sampler's own
        if not state.sampled:
            warnings_of(guard).once(
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
        guard = self._guard
        policy, trials = policy_of(guard), trials_of(guard)
        reset = False
        if trials.enter_run(state) == 1:
            reset_cuda_peak()  # where the objective runs torch on CUDA: its peak is this trial's
            reset = reset_rss_peak()  # the process's peak RSS too (Live reads it from here on)
        else:
            warnings_of(guard).once(
                "n_jobs",
                "Trials run as threads of one process (study.optimize(n_jobs>1)): the guard budgets the "
                "process as a whole, and a breach stops every guarded trial running in it. Use "
                "optuna_memprune.optimize(..., n_jobs=k) for one process per trial.",
            )
        if state.decision is Decision.UNCHECKED:  # nothing shows it fits beside what earlier trials left
            set_aside(state, "nothing predicted it to fit beside it: it runs unchecked")
        elif not policy.increments:  # a footprint function's figure is a fresh process's, without it
            set_aside(state, "its footprint is a fresh process's")
        if state.allowance:
            words = describe_allowance(policy, state)
            state.reason = f"{state.reason}; {words}"
            warnings_of(guard).once(
                "leftover", f"Trial {trial.number}: {words}. Said once; each such trial's record says so."
            )
        forecast = trial_forecast(guard, trial.storage, state)
        if forecast is not None:
            forecast.limit += state.allowance.get("ram", 0)
        live = Live(guard, state, threading.get_ident(), forecast, reset=reset)
        own: dict[str, int] | None = None  # the trial's increments, where it ran to the end alone
        watch = watch_of(guard)
        stopped = soft_pruned = returned = pruned_here = False
        oom: OutOfMemory | None = None
        try:
            try:
                watch.subscribe(live, trial.number)
                value = self._objective(trial)
                returned = True
                return value
            finally:
                live.disarm()
        except Interrupt as interrupt:
            live.disarm()  # the only interrupt of this trial was delivered: this call completes
            stopped = True
            reason = _outcome(policy, state, stopped=True, forecast=live.forecast_reason()).reason
            # Drop the objective's frames now: Optuna keeps the exception in a reference cycle until the
            # next garbage collection, and with it every array the objective held.
            interrupt.__traceback__ = None
            raise MemoryBudgetExceeded(f"memprune {reason}", state.hard_reading) from None
        except optuna.TrialPruned as pruned:
            soft_pruned, pruned_here = state.soft_answered, True
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
                # its one-time costs, where its frames are gone: it returned or was pruned (the demo's first
                # trial, soft-pruned, left 88 MiB of them counted as left by earlier trials)
                if (returned or pruned_here) and state.first and state.start is not None and not state.concurrent:
                    try:  # its one-time costs: not learned as increments
                        state.kept = watch.levels.kept(state.start)
                    except Exception:  # the record is written without them
                        _logger.debug("Trial %d: reading what it kept failed", trial.number, exc_info=True)
                if returned and state.hard_reading is None and state.start is not None and not state.concurrent:
                    own = {}
                    for r, v in peaks.items():
                        at_start = state.start.get(r)
                        if v is not None and at_start is not None:
                            own[r] = v - at_start - state.kept.get(r, 0)
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
                trials.exit_run(state)
                trials.close(state.trial_id)
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
        policy = policy_of(guard)
        own = (0 if watch.watching else 1) - policy.own_threads
        start = watch.levels.start(alone=not trials_of(guard).running(), threads=own)
    except Exception as exc:  # noqa: BLE001 - the guard's own failure never stops a trial
        _logger.warning("Trial %d: reading the process's usage at the start failed: %s", state.number, exc)
        return
    state.start, state.allowance, state.first = start.level, allowance(policy, start), start.first
    state.left = leftover(policy, start)
    full = describe_full(policy, start)
    if full is not None:
        warnings_of(guard).once("full", full)


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
        records.write(trial, policy_of(guard).record(state, trial.params, **record))
    finally:
        trials_of(guard).close(state.trial_id)


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


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """``trial.suggest_*`` for a stored distribution, through the public API."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise TypeError(f"unsupported distribution {type(dist).__name__} for param {name!r}")
