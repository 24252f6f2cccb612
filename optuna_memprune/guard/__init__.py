"""The guard: the only layer that touches Optuna's sampler, pruner and trial machinery.

``MemoryGuard`` holds the footprint, budget and choices (its ``Policy``); its ``wrap_sampler``,
``wrap_pruner`` and ``wrap_objective`` return the pieces below. Backends that run trials elsewhere (the
process-per-trial runner, ``memprune run``) sit above this package and take what they need from
``guard.backend``. The trial record's names live in ``optuna_memprune.records`` only.
"""

from __future__ import annotations

from ..records import Decision, Enforcement, EnforcementMode, TrialRecord
from ..records import read as read_record
from ._guard import MemoryGuard
from ._objective import GuardedObjective
from ._pruner import GuardedPruner
from ._sampler import GuardedSampler
from ._watch import MemoryBudgetExceeded

__all__ = [
    "MemoryGuard",
    "GuardedSampler",
    "GuardedPruner",
    "GuardedObjective",
    "MemoryBudgetExceeded",
    "Decision",
    "Enforcement",
    "EnforcementMode",
    "TrialRecord",
    "read_record",
]
