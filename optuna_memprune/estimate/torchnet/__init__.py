"""Training and inference steps of torch networks traced on the meta device, counted as tensor-level peaks.

Owns the package's public names, re-exported lazily from its modules (so ``torchnet.workspaces`` can be
imported alone, as the calibration's kernel probe does); knows nothing of how they are computed.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["torch_training", "torch_inference", "clear_cache", "WORKSPACE_RULES"]

# public name -> the module of this package that defines it
_LAZY = {
    "torch_training": "api",
    "torch_inference": "api",
    "clear_cache": "api",
    "WORKSPACE_RULES": "workspaces",
    # the kernel probe of calibration.py reads these two until it imports torchnet.workspaces itself
    "_channel_block": "workspaces",
    "_workspace_features": "workspaces",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name.lstrip("_"))
    if name.startswith("_") and not name.startswith("__"):  # interim, while the tests read api's private names
        return getattr(importlib.import_module(".api", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
