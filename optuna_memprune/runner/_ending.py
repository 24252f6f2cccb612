"""How a trial's process ended, from what came back through its pipe, its exit code and its cgroup: the
final state, the values, the words for a failure, out of memory, a kill at the cgroup limit, and the
exception that must stop the run.

Runs in the runner's process; knows nothing of the study's storage, the record's attrs or the ledger.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from ..guard.backend import OutOfMemory, killed_by_oom_killer, out_of_memory
from ._child import Outcome

if TYPE_CHECKING:
    from ._watchdog import TrialProcess

_logger = logging.getLogger("optuna_memprune.guard")


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


def judge(child: TrialProcess, catch: tuple) -> Ending:
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
