"""How a trial that ran ended, in the record's terms: the decision, the reason and the breach reading.

One rule for the in-process objective and the process-per-trial runner; knows nothing of how the trial
was stopped or how its readings were taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..records import Decision

if TYPE_CHECKING:
    from ..monitor import Reading
    from ._oom import OutOfMemory
    from ._policy import Policy


class Outcome(NamedTuple):
    """The record's ending of a trial; ``None`` decision or reason keeps the launch's."""

    decision: Decision | None
    reason: str | None
    breach: Reading | None


def trial_outcome(
    policy: Policy,
    launch_reason: str,
    *,
    soft_reading: Reading | None,
    hard_reading: Reading | None,
    stopped_by: str | None = None,
    soft_pruned: bool = False,
    failed: str | None = None,
    out_of_memory: OutOfMemory | None = None,
    ended_first: str = "the objective ended first",
    forecast: str | None = None,
) -> Outcome:
    """The decision, reason and breach of a trial that ran.

    ``stopped_by`` ("in process", "by the runner") when the guard stopped the trial at the budget;
    ``soft_pruned`` when it ended pruned after the pruner answered True at the soft line; ``failed`` the
    words for a trial that failed on its own (its process died, its objective raised); ``out_of_memory`` a
    trial that ran out of memory (``_oom``), which ends PRUNED as infeasible. A trial that crossed
    the budget but was not stopped says so, with ``ended_first`` as the reason it was not. The breach is
    the soft reading of a soft-pruned trial, else the budget's crossing or the soft one.

    Examples:
        >>> import optuna_memprune as omp
        >>> from optuna_memprune.guard._policy import Policy
        >>> from optuna_memprune.monitor import Reading
        >>> policy = Policy(lambda p: omp.Footprint(), omp.Budget(ram="100MiB"), on_infeasible="clamp",
        ...                 clamp=None, search_space=None, interval=0.1, soft=0.9)
        >>> hard = Reading(t=0.0, rss=120 * 2**20, hwm=120 * 2**20, threads=1, processes=1, pss=None, vram=None)
        >>> trial_outcome(policy, "admitted", soft_reading=hard, hard_reading=hard, stopped_by="in process").reason
        'stopped in process: RSS 120.00 MiB over the budget 100.00 MiB'
    """
    decision: Decision | None = None
    reason: str | None = None
    if stopped_by is not None and forecast is not None and hard_reading is None:
        decision, reason = Decision.FORECAST_STOPPED, f"{forecast} ({stopped_by})"
    elif stopped_by is not None:
        decision = Decision.STOPPED
        reason = f"stopped {stopped_by}: {policy.describe_breach(hard_reading, 1.0)}"
    elif out_of_memory is not None:
        decision = Decision.OUT_OF_MEMORY
        reason = out_of_memory.describe(policy.budget)
    elif soft_pruned:
        decision = Decision.SOFT_PRUNED
        reason = f"pruned at the soft line: {policy.describe_breach(soft_reading, policy.soft)}"
    elif hard_reading is not None:
        reason = f"{launch_reason}; crossed the budget ({policy.describe_breach(hard_reading, 1.0)}) but {ended_first}"
    elif failed is not None:
        reason = f"{launch_reason}; {failed}"
    breach = soft_reading if decision is Decision.SOFT_PRUNED else hard_reading or soft_reading
    return Outcome(decision, reason, breach)
