"""Replay, rollout and deque buffers as Footprints, from their exact array layouts and measured object sizes.

Owns the package's names, re-exported from its modules; knows nothing of how they are computed (nor
gymnasium, torch, psutil or Optuna: importing the package needs numpy only).

The modules, bottom up: ``layouts`` (SB3's buffers as tables of (name, shape, dtype), the argument checks,
page rounding, frame stacking), ``fill`` (RSS as transitions are added: ``Growth``, ``FillCurve``, the
replay curve), ``sb3`` (SB3's replay and rollout buffers and a lone array as Footprints) and ``deque`` (a
deque of transition tuples, from object sizes measured with tracemalloc).

Public within the package (other modules, tests): ``layouts.check_count``, ``check_shape``, ``check_dtype``,
``check_steps``, ``round_up``, ``FLOAT32``; ``fill.replay_parts`` and ``replay_curve``.
"""

from __future__ import annotations

from .deque import deque_buffer, deque_fill_curve, measure_object_overheads
from .fill import FillCurve, Growth, replay_fill_curve
from .layouts import (
    ATARI_FRAME_DTYPE,
    ATARI_FRAME_SHAPE,
    Field,
    frame_stack,
    layout_nbytes,
    sb3_dict_replay_layout,
    sb3_replay_layout,
    sb3_rollout_layout,
)
from .sb3 import array, replay_buffer, rollout_buffer

# The allocators' constants stay importable from here, as before the split (outside ``__all__``).
from .deque import (  # noqa: F401  isort: skip
    GLIBC_MALLOC_ALIGNMENT,
    GLIBC_MINSIZE,
    GLIBC_MMAP_THRESHOLD,
    GLIBC_SIZE_SZ,
    PYMALLOC_ALIGNMENT,
    PYMALLOC_MAX,
    PYMALLOC_POOL_OVERHEAD,
    PYMALLOC_POOL_SIZE,
)
from .fill import HUGE_PAGE_SIZE, NUMPY_HUGEPAGE_MIN  # noqa: F401  isort: skip
from .layouts import PAGE_SIZE  # noqa: F401  isort: skip

__all__ = [
    "Field",
    "Growth",
    "FillCurve",
    "sb3_replay_layout",
    "sb3_dict_replay_layout",
    "sb3_rollout_layout",
    "layout_nbytes",
    "replay_buffer",
    "replay_fill_curve",
    "rollout_buffer",
    "deque_buffer",
    "deque_fill_curve",
    "measure_object_overheads",
    "array",
    "frame_stack",
    "ATARI_FRAME_SHAPE",
    "ATARI_FRAME_DTYPE",
]
