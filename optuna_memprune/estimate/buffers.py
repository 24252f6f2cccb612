"""Replay, rollout and deque buffers as Footprints, from their exact array layouts and measured object sizes.

Knows numpy shapes, dtypes and the allocators' rounding rules; must not know gymnasium, torch, psutil or Optuna.
"""

from __future__ import annotations

import collections
import math
import operator
import sys
import threading
import tracemalloc
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..exceptions import EstimateError
from ..units import format_bytes
from .checks import check_int, check_number
from .footprint import Component, Footprint, Kind

__all__ = [
    "Field", "Growth", "FillCurve",
    "sb3_replay_layout", "sb3_dict_replay_layout", "sb3_rollout_layout", "layout_nbytes",
    "replay_buffer", "replay_fill_curve", "rollout_buffer",
    "deque_buffer", "deque_fill_curve", "measure_object_overheads",
    "array", "frame_stack",
    "ATARI_FRAME_SHAPE", "ATARI_FRAME_DTYPE",
]

# Pages. A base page is 4 KiB on x86-64 (and the default on aarch64 Linux); `getconf PAGESIZE`.
PAGE_SIZE = 4096
# A PMD-sized transparent huge page on x86-64 (linux Documentation/admin-guide/mm/transhuge.rst).
HUGE_PAGE_SIZE = 2 * 1024 * 1024
# numpy/_core/src/multiarray/alloc.c: data of at least 1 << 22 bytes gets madvise(MADV_HUGEPAGE).
NUMPY_HUGEPAGE_MIN = 1 << 22

# glibc malloc/malloc.c: request2size() = (req + SIZE_SZ + MALLOC_ALIGN_MASK) & ~MALLOC_ALIGN_MASK, at
# least MINSIZE; requests from DEFAULT_MMAP_THRESHOLD_MIN up are mmap()ed whole pages with a 2 * SIZE_SZ
# header (the threshold then moves up to the largest freed mmapped chunk, at most 32 MiB on 64-bit).
GLIBC_SIZE_SZ = 8
GLIBC_MALLOC_ALIGNMENT = 16
GLIBC_MINSIZE = 32
GLIBC_MMAP_THRESHOLD = 128 * 1024

# CPython Objects/obmalloc.c (3.10+ on 64-bit, radix tree on): requests up to SMALL_REQUEST_THRESHOLD
# come from 16 KiB pools (POOL_BITS 14) in size classes of ALIGNMENT bytes, each pool losing
# POOL_OVERHEAD (its header) to bookkeeping; larger requests fall through to the system malloc.
PYMALLOC_ALIGNMENT = 16
PYMALLOC_MAX = 512
PYMALLOC_POOL_SIZE = 16 * 1024
PYMALLOC_POOL_OVERHEAD = 48

# Atari after SB3's AtariWrapper (WarpFrame to 84x84 grayscale): one frame, channels last.
ATARI_FRAME_SHAPE = (84, 84, 1)
ATARI_FRAME_DTYPE = "uint8"

_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)


# Every SB3 layout below is ONE table of Field (name, shape, dtype) written after
# stable_baselines3/common/buffers.py (2.9): byte counts, fill curves and the tests all read that table.


class Field(NamedTuple):
    """One array of a buffer: SB3's attribute name, its full shape and dtype. ``nbytes`` is shape x itemsize."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def layout_nbytes(fields: Iterable[Field]) -> int:
    """Bytes of a whole layout: the sum of its arrays' ``nbytes`` (what the arrays take once full)."""
    return sum(f.nbytes for f in fields)


# --------------------------------------------------------------------------------------------- checks


def _count(value: Any, name: str, *, minimum: int = 1) -> int:
    """An int >= minimum; integral floats (``1e6`` from a YAML file) and numpy ints pass, bools do not."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif not isinstance(value, bool) and hasattr(value, "__index__"):
        value = operator.index(value)
    return check_int(value, name, minimum=minimum)


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise EstimateError(f"{name} must be a shape (a tuple of positive ints), but got {value!r}.")
    if not isinstance(value, Sequence):
        value = (value,)
    try:
        return tuple(_count(v, name) for v in value)
    except EstimateError:
        raise EstimateError(f"{name} must be a shape (a tuple of positive ints), but got {value!r}.") from None


def _dtype(value: Any, name: str) -> np.dtype:
    if value is None:  # np.dtype(None) is float64: never what a caller meant
        raise EstimateError(f"{name} must be a numpy dtype or dtype name such as 'uint8', but got None.")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise EstimateError(
            f"{name} must be a numpy dtype or dtype name such as 'uint8', but got {value!r}."
        ) from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise EstimateError(f"{name} must be a fixed-size numpy dtype, but got {value!r}.")
    return dtype


def _obs_shape(value: Any, name: str) -> tuple[int, ...]:
    # SB3 get_obs_shape: a Discrete observation (gymnasium shape ()) is stored as (1,).
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 0:
        return (1,)
    return _shape(value, name)


def _action_dim(value: Any, name: str) -> int:
    """SB3 get_action_dim from the action space's shape: Box prod(shape), Discrete () -> 1,
    MultiDiscrete (len(nvec),), MultiBinary (n,)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 0:
        return 1
    return math.prod(_shape(value, name))


def _replay_action_dtype(dtype: np.dtype) -> np.dtype:
    # ReplayBuffer._maybe_cast_dtype: float64 actions are stored as float32, every other dtype as is.
    return _FLOAT32 if dtype == _FLOAT64 else dtype


def _device_is_cuda(device: Any) -> bool:
    text = str(device)
    if text == "cpu":
        return False
    if text.startswith("cuda"):
        return True
    raise EstimateError(f"device must be 'cpu' or 'cuda[:N]', but got {device!r}.")


def _optional_steps(steps: Any) -> int | None:
    return None if steps is None else _count(steps, "steps", minimum=0)


# --------------------------------------------------------------------------------------------- layouts


def sb3_replay_layout(
    obs_shape: Sequence[int],
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    buffer_size: int,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
) -> list[Field]:
    """The arrays of SB3's ``ReplayBuffer`` (stable_baselines3/common/buffers.py, 2.9).

    Each array has ``max(buffer_size // n_envs, 1)`` rows of ``n_envs``: observations keep their dtype,
    ``next_observations`` is absent with ``optimize_memory_usage``, actions are ``(…, action_dim)`` with
    float64 stored as float32, rewards, dones and timeouts are float32. ``timeouts`` is always allocated
    (SB3's own memory check leaves it out).

    Args:
        obs_shape: The observation space's shape (``()`` for Discrete is stored as ``(1,)``).
        obs_dtype: The observation space's dtype (``"uint8"`` for images).
        action_shape: The action space's shape: Box ``shape``, Discrete ``()``, MultiDiscrete
            ``(len(nvec),)``, MultiBinary ``(n,)``.
        action_dtype: The action space's dtype (gymnasium: Discrete and MultiDiscrete int64, MultiBinary
            int8, Box float32 by default).
        buffer_size: Transitions in all envs together; >= 1.
        n_envs: Parallel envs; >= 1.
        optimize_memory_usage: SB3's single-array variant; needs ``handle_timeout_termination=False``.
        handle_timeout_termination: SB3's flag; SB3 refuses it together with ``optimize_memory_usage``.

    Example:
        >>> [f.name for f in sb3_replay_layout((4, 84, 84), "uint8", (), "int64", buffer_size=100)]
        ['observations', 'next_observations', 'actions', 'rewards', 'dones', 'timeouts']
    """
    buffer_size = _count(buffer_size, "buffer_size")
    n_envs = _count(n_envs, "n_envs")
    if optimize_memory_usage and handle_timeout_termination:
        raise EstimateError(
            "SB3's ReplayBuffer does not support optimize_memory_usage=True together with "
            "handle_timeout_termination=True; pass handle_timeout_termination=False."
        )
    obs_shape = _obs_shape(obs_shape, "obs_shape")
    obs_dtype = _dtype(obs_dtype, "obs_dtype")
    action_dim = _action_dim(action_shape, "action_shape")
    action_dtype = _replay_action_dtype(_dtype(action_dtype, "action_dtype"))
    rows = max(buffer_size // n_envs, 1)
    fields = [Field("observations", (rows, n_envs, *obs_shape), obs_dtype)]
    if not optimize_memory_usage:
        fields.append(Field("next_observations", (rows, n_envs, *obs_shape), obs_dtype))
    fields.append(Field("actions", (rows, n_envs, action_dim), action_dtype))
    fields.extend(Field(name, (rows, n_envs), _FLOAT32) for name in ("rewards", "dones", "timeouts"))
    return fields


def sb3_dict_replay_layout(
    obs_spaces: Mapping[str, tuple[Sequence[int], Any]],
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    buffer_size: int,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
) -> list[Field]:
    """The arrays of SB3's ``DictReplayBuffer``: one observations and one next_observations array per key.

    Fields are named ``observations['key']`` and ``next_observations['key']`` (SB3 keeps them in dicts);
    the rest is as :func:`sb3_replay_layout`. SB3 does not support ``optimize_memory_usage`` here.

    Args:
        obs_spaces: ``{key: (shape, dtype)}`` of the Dict observation space's sub-spaces, in order.
        action_shape, action_dtype, buffer_size, n_envs, handle_timeout_termination: As
            :func:`sb3_replay_layout`.
        optimize_memory_usage: Must be False (SB3 asserts it).

    Example:
        >>> layout = sb3_dict_replay_layout({"img": ((3, 64, 64), "uint8"), "vec": ((5,), "float32")},
        ...                                 (2,), "float32", buffer_size=10)
        >>> [f.name for f in layout][:2]
        ["observations['img']", "observations['vec']"]
    """
    if optimize_memory_usage:
        raise EstimateError("SB3's DictReplayBuffer does not support optimize_memory_usage=True, but got True.")
    if not isinstance(obs_spaces, Mapping) or not obs_spaces:
        raise EstimateError(f"obs_spaces must be a non-empty dict of key -> (shape, dtype), but got {obs_spaces!r}.")
    buffer_size = _count(buffer_size, "buffer_size")
    n_envs = _count(n_envs, "n_envs")
    rows = max(buffer_size // n_envs, 1)
    obs: list[tuple[str, tuple[int, ...], np.dtype]] = []
    for key, spec in obs_spaces.items():
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise EstimateError(f"obs_spaces[{key!r}] must be (shape, dtype), but got {spec!r}.")
        obs.append((str(key), _obs_shape(spec[0], f"obs_spaces[{key!r}] shape"),
                    _dtype(spec[1], f"obs_spaces[{key!r}] dtype")))
    action_dim = _action_dim(action_shape, "action_shape")
    action_dtype = _replay_action_dtype(_dtype(action_dtype, "action_dtype"))
    fields = [Field(f"{prefix}[{key!r}]", (rows, n_envs, *shape), dtype)
              for prefix in ("observations", "next_observations") for key, shape, dtype in obs]
    fields.append(Field("actions", (rows, n_envs, action_dim), action_dtype))
    fields.extend(Field(name, (rows, n_envs), _FLOAT32) for name in ("rewards", "dones", "timeouts"))
    return fields


# SB3 RolloutBuffer.get(): the arrays swap_and_flatten() replaces, in the order it replaces them.
_ROLLOUT_FLATTENED = ("observations", "actions", "values", "log_probs", "advantages", "returns")


def sb3_rollout_layout(
    obs_shape: Sequence[int],
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    n_steps: int,
    n_envs: int = 1,
) -> list[Field]:
    """The arrays of SB3's ``RolloutBuffer`` (``reset()`` in stable_baselines3/common/buffers.py, 2.9).

    ``(n_steps, n_envs, *obs_shape)`` in the observation dtype, ``(n_steps, n_envs, action_dim)`` in the
    action dtype as given (no float64 -> float32 cast here, unlike the replay buffer), and six float32
    ``(n_steps, n_envs)`` arrays: rewards, returns, episode_starts, values, log_probs, advantages.

    Example:
        >>> layout_nbytes(sb3_rollout_layout((4,), "float32", (), "int64", n_steps=2048))
        98304
    """
    n_steps = _count(n_steps, "n_steps")
    n_envs = _count(n_envs, "n_envs")
    obs_shape = _obs_shape(obs_shape, "obs_shape")
    fields = [
        Field("observations", (n_steps, n_envs, *obs_shape), _dtype(obs_dtype, "obs_dtype")),
        Field("actions", (n_steps, n_envs, _action_dim(action_shape, "action_shape")),
              _dtype(action_dtype, "action_dtype")),
    ]
    fields.extend(Field(name, (n_steps, n_envs), _FLOAT32)
                  for name in ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages"))
    return fields


# --------------------------------------------------------------------------------------------- fill model


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


class Growth(NamedTuple):
    """How one part of a buffer grows as transitions are added. All numbers are bytes except counts.

    After ``steps`` transitions, ``min(rows, ceil((steps + lead_steps) / steps_per_row))`` rows of
    ``row_bytes`` are touched; RSS is that rounded up to ``granule``, plus ``slack`` once anything is
    touched, capped at ``full``.
    """

    name: str
    row_bytes: int
    rows: int
    full: int
    steps_per_row: int = 1
    lead_steps: int = 0
    granule: int = 1
    slack: int = 0

    def ram(self, steps: int) -> int:
        if steps + self.lead_steps <= 0 or self.row_bytes == 0:
            return 0
        rows = min(self.rows, -(-(steps + self.lead_steps) // self.steps_per_row))
        return min(self.full, _round_up(rows * self.row_bytes, self.granule) + self.slack)


@dataclass(frozen=True)
class FillCurve:
    """RSS of a buffer as a function of the transitions added to it (all envs together). Bytes.

    Plain data: ``parts`` say how each array grows; ``ram(steps)`` evaluates them, ``full`` is the RSS once
    every part is full and ``steps_for(ram)`` inverts the curve for a monitor's forecast.

    Example:
        >>> curve = replay_fill_curve((4, 84, 84), "uint8", (), "int64", buffer_size=20_000)
        >>> curve.ram(0), curve.steps_to_full
        (0, 20000)
    """

    name: str
    parts: tuple[Growth, ...]
    steps_to_full: int

    def ram(self, steps: int | None = None) -> int:
        """RSS after ``steps`` transitions (``None``: full)."""
        steps = self.steps_to_full if steps is None else _count(steps, "steps", minimum=0)
        return sum(part.ram(steps) for part in self.parts)

    @property
    def full(self) -> int:
        return sum(part.full for part in self.parts)

    def steps_for(self, ram: int) -> int | None:
        """The fewest transitions after which the buffer holds at least ``ram`` bytes; None if never."""
        if ram > self.full:
            return None
        lo, hi = 0, self.steps_to_full
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ram(mid) >= ram:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _array_growth(field: Field, *, steps_per_row: int, lead_steps: int = 0, written: bool = True,
                  huge_pages: bool = False) -> Growth:
    """A ring-buffer array filled row by row along axis 0, pages mapped on first write.

    With huge pages the array's offset within 2 MiB regions is unknown: the pages before its first
    2 MiB boundary are small, every region after it is faulted in whole. RSS is then below
    ``touched + 2 MiB``; ``slack`` adds that bound (an over-estimate of at most 2 MiB per array).
    """
    full = _round_up(field.nbytes, PAGE_SIZE)
    slack = HUGE_PAGE_SIZE - PAGE_SIZE if huge_pages and field.nbytes >= NUMPY_HUGEPAGE_MIN else 0
    row_bytes = field.nbytes // field.shape[0] if written else 0
    return Growth(field.name, row_bytes, field.shape[0], full if written else 0, steps_per_row, lead_steps,
                  PAGE_SIZE, slack)


def _replay_parts(
    obs_shape: Any, obs_dtype: Any, action_shape: Any, action_dtype: Any, *, buffer_size: Any, n_envs: Any,
    optimize_memory_usage: bool, handle_timeout_termination: bool, dict_obs: Mapping[str, Any] | None,
) -> tuple[list[Field], int, int]:
    if dict_obs is not None:
        if obs_shape is not None or obs_dtype is not None:
            raise EstimateError(
                f"obs_shape and obs_dtype must be None when dict_obs is given, but got {obs_shape!r} and "
                f"{obs_dtype!r}."
            )
        fields = sb3_dict_replay_layout(
            dict_obs, action_shape, action_dtype, buffer_size=buffer_size, n_envs=n_envs,
            optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=handle_timeout_termination,
        )
    else:
        fields = sb3_replay_layout(
            obs_shape, obs_dtype, action_shape, action_dtype, buffer_size=buffer_size, n_envs=n_envs,
            optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=handle_timeout_termination,
        )
    n_envs = _count(n_envs, "n_envs")
    return fields, fields[0].shape[0], n_envs


def _replay_curve(fields: list[Field], rows: int, n_envs: int, *, optimize_memory_usage: bool,
                  handle_timeout_termination: bool, huge_pages: bool, name: str) -> FillCurve:
    parts = []
    for field in fields:
        # optimize_memory_usage: add() also writes next_obs into the following row of `observations`.
        lead = n_envs if optimize_memory_usage and field.name == "observations" else 0
        # `timeouts` is written only when handle_timeout_termination; never-written zero pages cost no RSS.
        written = field.name != "timeouts" or handle_timeout_termination
        parts.append(_array_growth(field, steps_per_row=n_envs, lead_steps=lead, written=written,
                                   huge_pages=huge_pages))
    return FillCurve(name, tuple(parts), rows * n_envs)


def replay_fill_curve(
    obs_shape: Sequence[int] | None,
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    buffer_size: int,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
    dict_obs: Mapping[str, tuple[Sequence[int], Any]] | None = None,
    huge_pages: bool = False,
    name: str = "replay buffer",
) -> FillCurve:
    """RSS of an SB3 replay buffer as a function of the transitions added (all envs together).

    ``np.zeros`` maps pages lazily: after ``steps`` transitions each array holds ``ceil(steps / n_envs)``
    rows (one more of ``observations`` with ``optimize_memory_usage``), contiguous along axis 0, rounded up
    to pages. Args as :func:`replay_buffer`.

    Where transparent huge pages are on ("always" or "madvise"), numpy advises ``MADV_HUGEPAGE`` for
    arrays of 4 MiB or more, so such an array fills in 2 MiB steps: pass ``huge_pages=True`` there to
    get an upper bound (up to 2 MiB more per array while filling; the full size is the same).
    """
    fields, rows, n_envs = _replay_parts(
        obs_shape, obs_dtype, action_shape, action_dtype, buffer_size=buffer_size, n_envs=n_envs,
        optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=handle_timeout_termination,
        dict_obs=dict_obs,
    )
    return _replay_curve(fields, rows, n_envs, optimize_memory_usage=optimize_memory_usage,
                         handle_timeout_termination=handle_timeout_termination, huge_pages=huge_pages, name=name)


def _fill_note(curve: FillCurve, layout: int, steps: int | None) -> str:
    if steps is None or steps >= curve.steps_to_full:
        filled = f"full ({curve.steps_to_full:,} transitions)"
    else:
        filled = f"after {steps:,} of {curve.steps_to_full:,} transitions"
    return f"RSS {filled}; {format_bytes(layout)} allocated, {format_bytes(curve.full)} RSS when full"


def _batch_copies(per_item: int, batch: int, *, live_batches: int, cuda: bool) -> tuple[int, int]:
    """(ram, vram) of minibatch copies: numpy fancy-index copies, then torch copies (``to_torch``)."""
    numpy_bytes = per_item * batch
    torch_bytes = per_item * batch * live_batches
    return (numpy_bytes, torch_bytes) if cuda else (numpy_bytes + torch_bytes, 0)


def replay_buffer(
    obs_shape: Sequence[int] | None,
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    buffer_size: int,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
    dict_obs: Mapping[str, tuple[Sequence[int], Any]] | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    huge_pages: bool = False,
    name: str = "replay buffer",
) -> Footprint:
    """The RSS of an SB3 ``ReplayBuffer`` (or ``DictReplayBuffer``) after ``steps`` transitions.

    The component's ``ram`` is the RSS of the buffer's arrays after ``steps`` transitions (``None``: full);
    its note gives the allocated and the full size. With ``batch_size`` a second component counts one
    ``sample()``: the numpy fancy-index copies and their torch copies (on ``device``).

    Args:
        obs_shape, obs_dtype: The observation space's shape and dtype; None for both with ``dict_obs``.
        action_shape, action_dtype: See :func:`sb3_replay_layout`.
        buffer_size: Transitions in all envs together; >= 1.
        n_envs: Parallel envs; >= 1. Default 1.
        optimize_memory_usage: Default False. Needs ``handle_timeout_termination=False`` (as in SB3).
        handle_timeout_termination: Default True; when False ``timeouts`` is never written (no RSS).
        dict_obs: ``{key: (shape, dtype)}`` for a Dict observation space (``DictReplayBuffer``).
        steps: Transitions added so far, all envs together (SB3's ``num_timesteps``); None means full.
        batch_size: If given, add the copies one ``sample(batch_size)`` makes. Default None (not counted).
        device: ``"cpu"`` or ``"cuda[:N]"``: where the sampled torch tensors live.
        huge_pages: True where transparent huge pages apply to numpy's large arrays (2 MiB fill steps).
        name: The component's name.

    Example:
        >>> fp = replay_buffer((4, 84, 84), "uint8", (), "int64", buffer_size=1_000_000)
        >>> round(fp.ram / 1e9, 2)
        56.47
    """
    steps = _optional_steps(steps)
    fields, rows, n_envs = _replay_parts(
        obs_shape, obs_dtype, action_shape, action_dtype, buffer_size=buffer_size, n_envs=n_envs,
        optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=handle_timeout_termination,
        dict_obs=dict_obs,
    )
    curve = _replay_curve(fields, rows, n_envs, optimize_memory_usage=optimize_memory_usage,
                          handle_timeout_termination=handle_timeout_termination, huge_pages=huge_pages, name=name)
    components = [Component(name, Kind.BUFFER, ram=curve.ram(steps),
                            note=_fill_note(curve, layout_nbytes(fields), steps))]
    cuda = _device_is_cuda(device)
    if batch_size is not None:
        batch = _count(batch_size, "batch_size")
        # _get_samples: observations and next observations, actions, dones * (1 - timeouts), rewards.
        per_row = {f.name: f.nbytes // (f.shape[0] * f.shape[1]) for f in fields}
        obs = sum(v for k, v in per_row.items() if k.startswith("observations"))
        per_item = 2 * obs + per_row["actions"] + 2 * _FLOAT32.itemsize
        ram, vram = _batch_copies(per_item, batch, live_batches=1, cuda=cuda)
        components.append(Component(
            f"{name} sample() copies", Kind.TEMPORARIES, ram=ram, vram=vram,
            note=f"{batch:,} x {per_item:,} B as numpy copies, then as torch tensors on {device}",
        ))
    return Footprint(tuple(components))


def rollout_buffer(
    obs_shape: Sequence[int],
    obs_dtype: Any,
    action_shape: Sequence[int],
    action_dtype: Any,
    *,
    n_steps: int,
    n_envs: int = 1,
    batch_size: int | None = None,
    device: str = "cpu",
    name: str = "rollout buffer",
) -> Footprint:
    """An SB3 ``RolloutBuffer``, full, plus the extra RAM at the peak of ``get(batch_size)``.

    ``get()`` first replaces observations, actions, values, log_probs, advantages and returns by
    ``swap_and_flatten`` copies, one array at a time: with ``n_envs > 1`` the largest array briefly
    exists twice (with ``n_envs == 1`` the reshape is a view: no copy). Then each minibatch is copied by
    fancy indexing and again by ``to_torch``; a PPO loop still holds the previous minibatch's tensors while
    the next one is built. ``batch_size=None`` is ``get()``'s own default (A2C): one minibatch of the
    whole buffer, i.e. two more copies of it. The second component is the larger of the two moments.

    Known limitation: glibc's dynamic mmap threshold can keep about two freed minibatches in the heap
    when a minibatch is under 32 MiB (measured: up to 5 minibatches in all for 3.6 MB ones instead of 3);
    that allocator slack is not counted here.

    Args:
        obs_shape, obs_dtype, action_shape, action_dtype: See :func:`sb3_rollout_layout`.
        n_steps: Steps per env per rollout; >= 1.
        n_envs: Parallel envs; >= 1. Default 1.
        batch_size: The minibatch size given to ``get()`` (PPO's ``batch_size``); None: the whole buffer.
        device: ``"cpu"`` or ``"cuda[:N]"``: where the minibatch torch tensors live.
        name: The components' name.

    Example:
        >>> fp = rollout_buffer((4, 84, 84), "uint8", (), "int64", n_steps=128, n_envs=8, batch_size=256)
        >>> [c.name for c in fp.components]
        ['rollout buffer', 'rollout buffer get() copies']
    """
    fields = sb3_rollout_layout(obs_shape, obs_dtype, action_shape, action_dtype, n_steps=n_steps, n_envs=n_envs)
    n_steps, n_envs = fields[0].shape[0], fields[0].shape[1]
    by_name = {f.name: f for f in fields}
    flatten = max(by_name[k].nbytes for k in _ROLLOUT_FLATTENED) if n_envs > 1 else 0
    total = n_steps * n_envs
    batch = total if batch_size is None else min(_count(batch_size, "batch_size"), total)
    live = 2 if -(-total // batch) > 1 else 1
    # _get_samples: observations, actions cast to float32, values, log_probs, advantages, returns.
    obs_item = by_name["observations"].nbytes // total
    per_item = obs_item + by_name["actions"].shape[2] * _FLOAT32.itemsize + 4 * _FLOAT32.itemsize
    ram, vram = _batch_copies(per_item, batch, live_batches=live, cuda=_device_is_cuda(device))
    if flatten >= ram:
        peak, why = flatten, f"swap_and_flatten copy of the largest array ({format_bytes(flatten)})"
    else:
        peak, why = ram, (f"minibatch copies: {batch:,} x {per_item:,} B as numpy, "
                          f"{live} live as torch on {device}")
    return Footprint((
        Component(name, Kind.BUFFER, ram=layout_nbytes(fields),
                  note=f"{n_steps:,} steps x {n_envs} envs, filled every rollout"),
        Component(f"{name} get() copies", Kind.TEMPORARIES, ram=peak, vram=vram, note=f"peak of get(): {why}"),
    ))


def array(shape: Sequence[int], dtype: Any, *, name: str = "array", touched: float = 1.0,
          kind: Kind = Kind.BUFFER) -> Footprint:
    """One numpy array: RSS of the ``touched`` fraction of its bytes, rounded up to pages.

    Example:
        >>> array((1000, 1000), "float32").ram
        4001792
    """
    dims = _shape(shape, "shape")
    field = Field(name, dims, _dtype(dtype, "dtype"))
    check_number(touched, "touched", minimum=0, maximum=1)
    ram = min(_round_up(math.ceil(field.nbytes * touched), PAGE_SIZE), _round_up(field.nbytes, PAGE_SIZE))
    note = f"{'x'.join(map(str, dims))} {field.dtype.name}, {format_bytes(field.nbytes)}"
    if touched < 1.0:
        note += f", {touched:.0%} touched"
    return Footprint((Component(name, Kind(kind), ram=ram, note=note),))


def frame_stack(obs_shape: Sequence[int], n_stack: int, *, channels_last: bool | None = None) -> tuple[int, ...]:
    """The observation shape after SB3's ``VecFrameStack(n_stack)`` (``StackedObservations.compute_stacking``).

    Frames are stacked on the channel axis: the last one for channels-last, the first for channels-first.
    ``channels_last=None`` applies SB3's rule for image spaces (3-D: channels-first when the first axis
    is the smallest); anything else stacks on the last axis. SB3 detects only uint8 ``[0, 255]`` Box
    images that way and stacks every other space on the last axis: pass ``channels_last=True`` for a 3-D
    observation that is not such an image.

    Example:
        >>> frame_stack(ATARI_FRAME_SHAPE, 4)
        (84, 84, 4)
        >>> frame_stack((1, 84, 84), 4)
        (4, 84, 84)
    """
    shape = list(_shape(obs_shape, "obs_shape"))
    if not shape:
        raise EstimateError(f"obs_shape must have at least one axis to stack on, but got {obs_shape!r}.")
    n_stack = _count(n_stack, "n_stack")
    if channels_last is None:
        channels_last = not (len(shape) == 3 and int(np.argmin(shape)) == 0)
    shape[-1 if channels_last else 0] *= n_stack
    return tuple(shape)


# --------------------------------------------------------------------------------------------- deque


_MEASURE_LOCK = threading.Lock()
# CPython 3.11 Objects/tupleobject.c PyTuple_MAXFREELIST (2000 per size) and floatobject.c
# PyFloat_MAXFREELIST (100): more than this many objects are made before measuring.
_FREELIST_DRAIN = 2100
_SCALAR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64")


def _traced_at(line: int) -> int:
    """Bytes tracemalloc holds for live allocations made from one line of this file."""
    here = _traced_at.__code__.co_filename
    return sum(s.size for s in tracemalloc.take_snapshot().statistics("lineno")
               if s.traceback[0].filename == here and s.traceback[0].lineno == line)


def _traced_per_object(make: Any, n: int, *, freelist: bool = False) -> float:
    """Bytes tracemalloc sees per object that the one-line lambda ``make(i)`` returns.

    Only allocations made from the lambda's line count, so neither other threads nor this function's
    own bookkeeping disturb the figure. An object reused from a freelist or cache is no new allocation,
    so ``n`` objects (more for ``freelist=True``: tuple, float) are made before counting; for those types
    the result is floored at ``sys.getsizeof`` (which counts the GC header), since another thread may
    refill the freelist.
    """
    line = make.__code__.co_firstlineno
    warm = max(n, _FREELIST_DRAIN if freelist else 0)
    keep: list[Any] = [None] * (warm + n)
    for i in range(warm):
        keep[i] = make(i)
    before = _traced_at(line)
    for i in range(warm, warm + n):
        keep[i] = make(i)
    after = _traced_at(line)
    floor = sys.getsizeof(keep[-1]) if freelist else 0
    del keep
    return max((after - before) / n, floor)


def _measure_deque_blocks(n: int) -> tuple[int, int, int]:
    """(block bytes, items per block, items the first block takes) of ``collections.deque``, from the
    jumps of ``sys.getsizeof`` (CPython's ``deque.__sizeof__`` counts whole blocks)."""
    d: collections.deque[None] = collections.deque()
    jumps: list[tuple[int, int]] = []
    last = sys.getsizeof(d)
    for i in range(1, n + 1):
        d.append(None)
        size = sys.getsizeof(d)
        if size != last:
            jumps.append((i, size - last))
            last = size
            if len(jumps) == 3:
                break
    if len(jumps) < 3:
        raise RuntimeError(f"could not see three deque blocks in {n} appends: {jumps!r}")
    (first, block), (second, _), (third, _) = jumps
    return block, third - second, first - 1


def measure_object_overheads() -> dict[str, Any]:
    """Measure, in this interpreter, the bytes Python and numpy request per object of a deque buffer.

    Uses ``tracemalloc`` (numpy reports its data allocations to it, in its own domain) and identity
    checks. The figures are request sizes, before the allocators round them: :func:`deque_buffer` applies
    pymalloc's and glibc's rules on top. Safe beside other threads (only this module's allocations are
    counted, under a lock); tracemalloc is started and stopped only if it was not already tracing.

    Returns:
        A JSON-ready dict: ``tuple_base`` and ``tuple_per_item`` (a tuple of n items requests
        ``tuple_base + n * tuple_per_item``), ``ndarray_object`` (the array object), ``ndarray_dims_per_axis``
        (its shape and strides block, none for 0-d), ``ndarray_data_extra`` (data bytes beyond ``nbytes``),
        ``float``, ``int`` (an int past the small-int cache), ``small_int_max`` (largest shared int),
        ``bool`` (0: shared), ``numpy_scalars`` (``{dtype name: bytes}``, 0 where shared),
        ``deque_block``, ``deque_block_items``, ``deque_first_block_items``, plus ``python`` and ``numpy``
        versions.

    Example:
        >>> overheads = measure_object_overheads()
        >>> overheads["deque_block_items"], overheads["small_int_max"]
        (64, 256)
    """
    with _MEASURE_LOCK:
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start(1)
        try:
            return _measure(n=500)
        finally:
            if started:
                tracemalloc.stop()


def _measure(n: int) -> dict[str, Any]:
    sizes = {k: _traced_per_object(lambda i, k=k: tuple([None] * k), n, freelist=True) for k in (1, 9)}
    per_item = (sizes[9] - sizes[1]) / 8
    # An ndarray is its object, a shape-and-strides block per axis and its data (numpy's own tracemalloc
    # domain): T(nd) = object + nd * dims + nbytes + extra; two ndims give dims and extra.
    arrays = {nd: _traced_per_object(lambda i, nd=nd: np.empty((2,) * nd, np.uint8), n) for nd in (1, 3)}
    ndarray_object = np.ndarray.__basicsize__
    dims = (arrays[3] - arrays[1] - (8 - 2)) / 2
    small_int_max = max(i for i in range(-10, 2000) if int(str(i)) is int(str(i)))
    scalars = {}
    for name in _SCALAR_DTYPES:
        kind = np.dtype(name).type
        shared = kind(1) is kind(1)
        scalars[name] = 0 if shared else round(_traced_per_object(lambda i, kind=kind: kind(i % 2 + 1), n))
    block, block_items, first_items = _measure_deque_blocks(10_000)
    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "tuple_base": round(sizes[1] - per_item),
        "tuple_per_item": round(per_item),
        "ndarray_object": ndarray_object,
        "ndarray_dims_per_axis": round(dims),
        "ndarray_data_extra": max(0, round(arrays[1] - ndarray_object - dims - 2)),
        "float": round(_traced_per_object(lambda i: float(i) + 0.5, n, freelist=True)),
        "int": round(_traced_per_object(lambda i: i + 10**6, n)),
        "small_int_max": small_int_max,
        "bool": 0 if bool(int("1")) is True else sys.getsizeof(True),
        "numpy_scalars": scalars,
        "deque_block": block,
        "deque_block_items": block_items,
        "deque_first_block_items": first_items,
    }


@lru_cache(maxsize=1)
def _default_overheads() -> dict[str, Any]:
    return measure_object_overheads()


def _glibc_chunk(request: int) -> int:
    """Bytes glibc malloc takes for a request (chunk header and alignment; whole pages when mmapped)."""
    if request >= GLIBC_MMAP_THRESHOLD:
        return _round_up(request + 2 * GLIBC_SIZE_SZ, PAGE_SIZE)
    return max(GLIBC_MINSIZE, _round_up(request + GLIBC_SIZE_SZ, GLIBC_MALLOC_ALIGNMENT))


def _pymalloc_block(request: int) -> Fraction:
    """Bytes an object allocation takes: its pymalloc size class plus its share of the pool header (a
    fraction of a byte), or a glibc chunk beyond PYMALLOC_MAX."""
    if request <= 0:
        return Fraction(0)
    if request <= PYMALLOC_MAX:
        size = _round_up(request, PYMALLOC_ALIGNMENT)
        return Fraction(PYMALLOC_POOL_SIZE, (PYMALLOC_POOL_SIZE - PYMALLOC_POOL_OVERHEAD) // size)
    return Fraction(_glibc_chunk(request))


_OVERHEAD_KEYS = ("tuple_base", "tuple_per_item", "ndarray_object", "ndarray_dims_per_axis",
                  "ndarray_data_extra", "float", "numpy_scalars", "deque_block", "deque_block_items",
                  "deque_first_block_items")


def _transition_bytes(transition: Any, ov: Mapping[str, Any]) -> tuple[int, int, str]:
    """(array data bytes, object and allocator bytes, a short description) of one transition tuple."""
    if isinstance(transition, (str, bytes)) or not isinstance(transition, Sequence) or not transition:
        raise EstimateError(
            f"transition must be a non-empty list of items ((shape, dtype), int, float, bool, None or a numpy "
            f"scalar type), but got {transition!r}."
        )
    data = 0
    other = _pymalloc_block(ov["tuple_base"] + ov["tuple_per_item"] * len(transition))  # exact, then rounded up
    words = []
    for i, item in enumerate(transition):
        if item is None or item is int or item is bool:  # shared: a reference, a small int, True/False
            words.append("ref" if item is None else item.__name__)
        elif item is float:
            other += _pymalloc_block(ov["float"])
            words.append("float")
        elif isinstance(item, type) and issubclass(item, np.generic):
            dtype = _dtype(item, f"transition[{i}]")
            if dtype.name not in ov["numpy_scalars"]:
                raise EstimateError(f"transition[{i}]: no measured size for numpy scalar {dtype.name!r} in overheads.")
            other += _pymalloc_block(ov["numpy_scalars"][dtype.name])
            words.append(f"np.{dtype.name}")
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            shape = _shape(item[0], f"transition[{i}] shape")
            dtype = _dtype(item[1], f"transition[{i}] dtype")
            nbytes = math.prod(shape) * dtype.itemsize
            chunk = _glibc_chunk(nbytes + ov["ndarray_data_extra"])
            data += nbytes
            other += chunk - nbytes + _pymalloc_block(ov["ndarray_object"])
            if shape:
                other += _glibc_chunk(ov["ndarray_dims_per_axis"] * len(shape))
            words.append(f"{'x'.join(map(str, shape))} {dtype.name}")
        else:
            raise EstimateError(
                f"transition[{i}] must be (shape, dtype), int, float, bool, None or a numpy scalar type, "
                f"but got {item!r}."
            )
    return data, math.ceil(other), f"({', '.join(words)})"


def _check_overheads(overheads: Any) -> Mapping[str, Any]:
    if overheads is None:
        return _default_overheads()
    if not isinstance(overheads, Mapping) or any(k not in overheads for k in _OVERHEAD_KEYS):
        raise EstimateError(
            f"overheads must be the dict measure_object_overheads() returns (keys {', '.join(_OVERHEAD_KEYS)}), "
            f"but got {overheads!r}."
        )
    return overheads


def deque_fill_curve(
    transition: Sequence[Any], *, maxlen: int, overheads: Mapping[str, Any] | None = None,
    name: str = "deque buffer",
) -> FillCurve:
    """RSS of a ``collections.deque(maxlen=...)`` of transition tuples as a function of appends.

    Args as :func:`deque_buffer`.
    """
    maxlen = _count(maxlen, "maxlen")
    ov = _check_overheads(overheads)
    data, other, _ = _transition_bytes(transition, ov)
    per = data + other
    per_block, first = ov["deque_block_items"], ov["deque_first_block_items"]
    lead = per_block - first  # the first block starts part-way, at the deque's centre
    blocks = -(-(maxlen + lead) // per_block)
    block_chunk = _glibc_chunk(ov["deque_block"])
    parts = (
        Growth("transitions", per, maxlen, per * maxlen),
        Growth("deque blocks", block_chunk, blocks, blocks * block_chunk, per_block, lead),
    )
    return FillCurve(name, parts, maxlen)


def deque_buffer(
    transition: Sequence[Any],
    *,
    maxlen: int,
    steps: int | None = None,
    overheads: Mapping[str, Any] | None = None,
    name: str = "deque buffer",
) -> Footprint:
    """A ``collections.deque(maxlen=...)`` of transition tuples (the tutorial DQN replay memory).

    Each transition is a tuple such as ``(obs, action, reward, next_obs, done)``; ``transition`` lists
    its items: ``(shape, dtype)`` for an ndarray that owns its data, ``int`` for a small (shared) int,
    ``float`` for a Python float, ``bool``, a numpy scalar type such as ``np.int64`` (what
    ``action_space.sample()`` returns), or ``None`` for a reference to an object counted elsewhere. Each
    object's bytes come from ``overheads`` (:func:`measure_object_overheads`; None: measured once in this
    process), rounded as pymalloc and glibc malloc round them, plus the deque's own blocks.

    Note: with ``obs`` and ``next_obs`` as separate arrays the deque holds every frame twice, as SB3's
    ``ReplayBuffer`` does without ``optimize_memory_usage``; if ``next_obs`` is the same array object as
    the following transition's ``obs``, list it as ``None`` and the frames count once.

    Known limitations: an array item that is a view (``obs[0]`` of a batched array) keeps its base array
    alive, which this model cannot see; an ``int`` item is taken to be a small, shared int (-5..256).

    Args:
        transition: The items of one transition tuple (see above).
        maxlen: The deque's ``maxlen``; >= 1.
        steps: Transitions appended so far; None means full.
        overheads: A dict from :func:`measure_object_overheads` (run by the calibration in a subprocess).
        name: The component's name.

    Example:
        >>> obs = ((4, 84, 84), "uint8")
        >>> fp = deque_buffer([obs, int, float, obs, bool], maxlen=20_000)
        >>> 1.12e9 < fp.ram < 1.14e9
        True
    """
    steps = _optional_steps(steps)
    maxlen = _count(maxlen, "maxlen")
    ov = _check_overheads(overheads)
    data, other, words = _transition_bytes(transition, ov)
    curve = deque_fill_curve(transition, maxlen=maxlen, overheads=ov, name=name)
    n = maxlen if steps is None else min(steps, maxlen)
    note = (f"{n:,} of {maxlen:,} tuples {words}: {data + other:,} B each "
            f"({data:,} B array data), {format_bytes(curve.full)} when full")
    return Footprint((Component(name, Kind.BUFFER, ram=curve.ram(steps), note=note),))
