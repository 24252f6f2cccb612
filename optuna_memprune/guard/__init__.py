"""The guard: the only layer that touches Optuna's sampler, pruner and trial machinery.

``MemoryGuard`` holds the footprint, budget and policy; its ``wrap_sampler``, ``wrap_pruner`` and
``wrap_objective`` return the pieces below. The trial record's names live in ``_records`` only.
"""

from __future__ import annotations

from ._guard import MemoryGuard
from ._objective import GuardedObjective, MemoryBudgetExceeded
from ._pruner import GuardedPruner
from ..records import Decision, TrialRecord, read as read_record
from ._runner import optimize
from ._sampler import GuardedSampler

__all__ = [
    "MemoryGuard",
    "GuardedSampler",
    "GuardedPruner",
    "GuardedObjective",
    "MemoryBudgetExceeded",
    "Decision",
    "TrialRecord",
    "read_record",
    "optimize",
]
