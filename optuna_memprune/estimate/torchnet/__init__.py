"""Training and inference steps of torch networks traced on the meta device, counted as tensor-level peaks.

Owns the package's names, re-exported lazily from its modules (so ``torchnet.workspaces`` imports alone, as
the calibration's kernel probe does); knows nothing of how they are computed.

The modules, in pipeline order: ``spec`` (arguments -> hashable spec), ``workspaces`` (CPU kernel workspace
rules), ``dispatch`` (the storage counter, categories and phases), ``analysis`` (peak and breakdown of a
trace), ``tracing`` (networks built on the trace device, the traced step), ``cache`` (batch-linear fitted
entries) and ``api`` (the public functions and the footprint assembly).

Public: ``torch_training``, ``torch_inference``, ``clear_cache``, ``WORKSPACE_RULES``. Public within the
package (tests, benchmarks, calibration): ``trace`` (one step under the counter, on meta or real CPU tensors),
``analyse``, ``allocator_events``, ``scale_workspaces`` and ``cached_entries``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["torch_training", "torch_inference", "clear_cache", "WORKSPACE_RULES"]

# name -> (module of this package, its name there)
_LAZY = {
    "torch_training": ("api", "torch_training"),
    "torch_inference": ("api", "torch_inference"),
    "clear_cache": ("api", "clear_cache"),
    "scale_workspaces": ("api", "scale_workspaces"),
    "WORKSPACE_RULES": ("workspaces", "WORKSPACE_RULES"),
    "trace": ("tracing", "trace"),
    "analyse": ("analysis", "analyse"),
    "allocator_events": ("analysis", "allocator_events"),
    "cached_entries": ("cache", "entries"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
