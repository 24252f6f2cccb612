"""Estimators: params -> Footprint. Pure: no optuna, no psutil; torch only where a network is traced.

The submodules that need torch are imported when first used, so ``import optuna_memprune`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from .footprint import Component, Footprint, Kind, total

__all__ = [
    "Component", "Footprint", "Kind", "total",
    "torch_training", "torch_inference",
    "replay_buffer", "rollout_buffer", "deque_buffer", "array",
    "process",
    "recipes", "learned",
]

_LAZY = {
    "torch_training": "torchnet",
    "torch_inference": "torchnet",
    "replay_buffer": "buffers",
    "rollout_buffer": "buffers",
    "deque_buffer": "buffers",
    "array": "buffers",
    "process": "recipes",
    "learned": "learn",  # footprints learned from observed trials (numpy only)  # with the recipes' stack names ("sb3", ...)
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name == "recipes":
        return importlib.import_module(".recipes", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
