"""How a trial's process ended, from what came back through its pipe, its exit code and its cgroup: the
final state, the values, the words for a failure, out of memory, a kill at the cgroup limit, and the
exception that must stop the run; and the record of the trial that ended, through the guard's ``Policy``.

Runs in the runner's process; knows nothing of the study's storage, the record's attrs or the ledger.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from typing import TYPE_CHECKING, Any, Protocol

from optuna.trial import TrialState

from .. import records
from ..guard.backend import OutOfMemory, killed_by_oom_killer, out_of_memory, trial_outcome
from ..records import Decision
from ._child import Outcome

if TYPE_CHECKING:
    from ..guard.backend import Policy, TrialGuardState
    from ..monitor import Reading
    from ._watchdog import TrialProcess

_logger = logging.getLogger("optuna_memprune.guard")


class Watched(Protocol):
    """What the record of a finished trial reads of its watched process: the runner's ``TrialProcess``, or
    what a Ray task sent back of its own (``_ray_task.TaskEnd``)."""

    state: TrialGuardState
    margins: dict[str, float]  # the learned margin its reservation applied
    reserved_prediction: bool  # False: unchecked at launch, it reserved the budget
    soft_reading: Reading | None
    hard_reading: Reading | None
    ended: float  # when its process was gone, on the clock of the readings' ``t``
    gpu: int | None

    def timeline(self) -> list[tuple[float, int, int, int | None]]: ...

    def enforcement(self) -> records.Enforcement: ...

    def forecast_reason(self) -> str | None: ...

    def forecast_record(self) -> dict[str, Any]: ...


@dataclasses.dataclass
class Ending:
    """A finished trial process, judged. ``stopped``: the runner or the kernel stopped it at the budget
    (``kernel`` holds the kernel's reason); ``failure``: the exception that ends the whole run."""

    state: TrialState
    peaks: dict[str, int | None]
    values: Any = None
    failed: str | None = None
    oom: OutOfMemory | None = None
    kernel: str | None = None
    stopped: bool = False
    soft_pruned: bool = False
    stop_asked: bool = False
    failure: BaseException | None = None


def judge(child: TrialProcess, catch: tuple[type[BaseException], ...]) -> Ending:
    """Judge a trial process that has ended (its result read, its tree gone)."""
    result = child.result if child.result is not None and child.result.outcome is not Outcome.LOST else None
    peak = child.monitor.peak if child.monitor is not None else None
    child_hwm = result.peak_rss if result else 0
    peaks = {
        "ram": max(peak.rss if peak else 0, child_hwm) or None,
        "vram": peak.vram if peak else None,
        "threads": peak.threads if peak else None,
    }
    peaks["ram"], kernel = child.kernel_verdict(peaks["ram"])  # kernel: why it killed at the cgroup limit
    end = Ending(TrialState.FAIL, peaks, kernel=kernel, stop_asked=bool(result and result.stop_asked))
    stopped = child.hard_reading is not None or kernel is not None or child.forecast_reason() is not None
    end.stopped = stopped and (result is None or result.outcome is not Outcome.COMPLETE)
    if end.stopped:
        end.state = TrialState.PRUNED
    elif result is None:
        code = child.process.exitcode
        end.failed = (
            f"its process died from signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"its process exited with code {code} without a result"
        )
        # the host's count rises for any OOM kill; the trial's own group, where it counts, is exact
        exact = child.cgroup is not None and child.cgroup.counts_oom_kills()
        end.oom = None if exact else killed_by_oom_killer(code, child.state.oom_kills)
        if code == -signal.SIGKILL and end.oom is None:
            end.failed += " (sent from outside the runner: the kernel's OOM killer sends SIGKILL)"
    elif result.outcome is Outcome.COMPLETE:
        end.state, end.values = TrialState.COMPLETE, result.values
    elif result.outcome is Outcome.PRUNED:
        end.state, end.soft_pruned = TrialState.PRUNED, result.soft
    else:  # FAIL
        exc, text, tb = result.error, result.message, result.traceback
        end.failed = f"the objective raised {text}"
        end.oom = out_of_memory(exc, text)  # infeasible: PRUNED, never a failure that stops the run
        caught = end.oom is not None or (exc is not None and isinstance(exc, catch))
        end.failure = None if caught else (exc if isinstance(exc, BaseException) else RuntimeError(text))
        if end.failure is not None and tb:
            _logger.error("Trial %d failed in its process:\n%s", child.trial.number, tb)
    if end.oom is not None:  # the sampler learns from its constraint
        end.state = TrialState.PRUNED
    return end


def finished_record(
    policy: Policy, child: Watched, end: Ending, ran: dict[str, Any], host: str | None
) -> records.TrialRecord:
    """The record of a trial whose process ended (``end``, from ``judge``): how it ended in the guard's
    words, its peaks (what it needed, after out of memory), the watchdog's timeline and breach, the margin
    its reservation applied, the host, GPU, enforcement and forecast; ``ran``: the params in the storage."""
    params = without_prediction(child.state, ran)
    outcome = trial_outcome(
        policy,
        child.state.reason,
        soft_reading=child.soft_reading,
        hard_reading=child.hard_reading,
        stopped_by="by the runner" if end.stopped and not end.kernel else None,
        soft_pruned=end.soft_pruned,
        failed=end.failed,
        out_of_memory=end.oom,
        forecast=child.forecast_reason(),
    )
    peaks = end.oom.needs(end.peaks, policy.budget) if end.oom is not None else end.peaks
    timeline = child.timeline()
    record = policy.record(
        child.state,
        params,
        decision=outcome.decision,
        reason=outcome.reason,
        peaks=peaks,
        timeline=timeline,
        breach=outcome.breach,
    )
    if end.stopped and end.kernel:
        record = dataclasses.replace(record, decision=Decision.STOPPED, reason=end.kernel)
    # the margin its reservation applied; a trial unchecked at launch reserved the budget instead
    budgeted = (
        {r: m for r, m in child.margins.items() if r in policy.budget.resources} if child.reserved_prediction else {}
    )
    record = dataclasses.replace(
        record,
        margin=budgeted,
        host=host,
        gpu=child.gpu,
        enforcement=child.enforcement(),
        forecast=child.forecast_record(),
    )
    if outcome.decision is Decision.STOPPED and child.hard_reading is not None:  # crossing reading -> tree gone
        stop_ms = round((child.ended - child.hard_reading.t) * 1000, 1)
        record = dataclasses.replace(record, breach={**record.breach, "stop_ms": stop_ms})
    return record


def without_prediction(state: TrialGuardState, params: dict[str, Any]) -> dict[str, Any]:
    """The params to build a finished trial's record from without calling the footprint again: it may be
    slow, and the trial's end is written before anything that can block. A trial that ran unchecked, or
    with other params than the checked ones (then unchecked, as the record says), keeps no prediction."""
    changed = sorted(k for k in state.assignment if k in params and params[k] != state.assignment[k])
    if state.prediction is not None and changed:
        state.uncheck(f"{state.reason}; params {changed} ran with values the guard did not check")
    return dict(params) if state.prediction is not None else {}
