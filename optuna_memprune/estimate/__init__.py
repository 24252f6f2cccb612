"""Estimators: params -> Footprint. Pure: no optuna, no psutil; torch only where a network is traced.

The submodules that need torch are imported when first used, so ``import optuna_memprune`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from .._extras import MissingExtra
from .footprint import Component, Footprint, Kind, total

__all__ = [
    "Component",
    "Footprint",
    "Kind",
    "total",
    "torch_training",
    "torch_inference",
    "replay_buffer",
    "rollout_buffer",
    "deque_buffer",
    "array",
    "process",
    "recipes",
    "learned",
]

_LAZY = {
    "torch_training": "torchnet",
    "torch_inference": "torchnet",
    "replay_buffer": "buffers",
    "rollout_buffer": "buffers",
    "deque_buffer": "buffers",
    "array": "buffers",
    "process": "recipes",
    "learned": "learn",  # footprints learned from observed trials (numpy only)
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY and name != "recipes":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f".{_LAZY.get(name, name)}", __name__)
        return module if name == "recipes" else getattr(module, name)
    except ImportError as exc:  # torch_training without torch: one line naming the extra
        missing = MissingExtra.of(exc, f"estimate.{name}")
        if missing is None:
            raise
        raise missing from None
