"""optuna-memprune: predict, budget and guard the memory and threads of Optuna trials.

The top level imports no torch, pynvml, rich or matplotlib; those load where they are used, and a call that needs
one an install lacks names the extra that brings it (``optuna_memprune._extras``).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._extras import MissingExtra
from .budget import Budget
from .estimate.footprint import Component, Footprint, Kind
from .exceptions import CalibrationError, EnforcementError, EstimateError, MemPruneError
from .units import format_bytes, parse_bytes

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and IDEs (loaded on first use at run time)
    from . import estimate
    from .guard import (
        Decision,
        Enforcement,
        EnforcementMode,
        GuardedObjective,
        GuardedPruner,
        GuardedSampler,
        MemoryBudgetExceeded,
        MemoryGuard,
        TrialRecord,
        read_record,
    )
    from .ledger import HostBudget, Ledger
    from .runner import OverBudget, optimize, tune_with_resources

logging.getLogger("optuna_memprune").addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "Component",
    "Footprint",
    "Kind",
    "format_bytes",
    "parse_bytes",
    "MemPruneError",
    "EstimateError",
    "CalibrationError",
    "EnforcementError",
    "MemoryGuard",
    "GuardedSampler",
    "GuardedPruner",
    "GuardedObjective",
    "MemoryBudgetExceeded",
    "read_record",
    "TrialRecord",
    "Decision",
    "Enforcement",
    "EnforcementMode",
    "optimize",
    "tune_with_resources",
    "OverBudget",
    "HostBudget",
    "Ledger",
    "MissingExtra",
    "estimate",
]

# Loaded on first use: the guard imports Optuna, which a user of the estimators alone need not pay for.
_GUARD = (
    "MemoryGuard",
    "GuardedSampler",
    "GuardedPruner",
    "GuardedObjective",
    "MemoryBudgetExceeded",
    "read_record",
    "TrialRecord",
    "Decision",
    "Enforcement",
    "EnforcementMode",
)
_LEDGER = ("HostBudget", "Ledger")


def __getattr__(name: str) -> Any:
    if name == "estimate":
        return importlib.import_module(".estimate", __name__)
    if name in _GUARD:
        return getattr(importlib.import_module(".guard", __name__), name)
    if name in ("optimize", "tune_with_resources", "OverBudget"):
        return getattr(importlib.import_module(".runner", __name__), name)
    if name in _LEDGER:
        return getattr(importlib.import_module(".ledger", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
