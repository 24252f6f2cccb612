"""SB3's buffer layouts as one table of (name, shape, dtype) each, and the buffers' argument checks.

Owns the Field table, page rounding, the shape/dtype/count checks and SB3's frame stacking; knows nothing of
fill curves, Footprints, the deque model, gymnasium, torch, psutil or Optuna.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ...exceptions import EstimateError
from .. import checks

__all__ = [
    "Field",
    "layout_nbytes",
    "sb3_replay_layout",
    "sb3_dict_replay_layout",
    "sb3_rollout_layout",
    "frame_stack",
    "ATARI_FRAME_SHAPE",
    "ATARI_FRAME_DTYPE",
    "PAGE_SIZE",
    "FLOAT32",
    "round_up",
    "check_count",
    "check_shape",
    "check_dtype",
    "check_steps",
]

# Pages. A base page is 4 KiB on x86-64 (and the default on aarch64 Linux); `getconf PAGESIZE`.
PAGE_SIZE = 4096

# Atari after SB3's AtariWrapper (WarpFrame to 84x84 grayscale): one frame, channels last.
ATARI_FRAME_SHAPE = (84, 84, 1)
ATARI_FRAME_DTYPE = "uint8"

FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)


def round_up(n: int, granule: int) -> int:
    """``n`` rounded up to a whole number of ``granule`` (pages, allocator size classes)."""
    return -(-n // granule) * granule


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


def check_count(value: Any, name: str, *, minimum: int = 1, kind: str = "items") -> int:
    """An int in ``[minimum, CEILINGS[kind]]`` (``checks.check_count``); integral floats (``1e6`` from a YAML
    file) and numpy ints pass, bools do not."""
    if not isinstance(value, (bool, float)) and hasattr(value, "__index__"):
        value = operator.index(value)
    return checks.check_count(value, name, kind, minimum=minimum)


def check_shape(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise EstimateError(f"{name} must be a shape (a tuple of positive ints), but got {value!r}.")
    if not isinstance(value, Sequence):
        value = (value,)
    try:
        return tuple(check_count(v, name) for v in value)
    except EstimateError:
        raise EstimateError(f"{name} must be a shape (a tuple of positive ints), but got {value!r}.") from None


def check_dtype(value: Any, name: str) -> np.dtype:
    if value is None:  # np.dtype(None) is float64: never what a caller meant
        raise EstimateError(f"{name} must be a numpy dtype or dtype name such as 'uint8', but got None.")
    try:
        dtype: np.dtype[Any] = np.dtype(value)
    except TypeError:
        raise EstimateError(f"{name} must be a numpy dtype or dtype name such as 'uint8', but got {value!r}.") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise EstimateError(f"{name} must be a fixed-size numpy dtype, but got {value!r}.")
    return dtype


def _obs_shape(value: Any, name: str) -> tuple[int, ...]:
    # SB3 get_obs_shape: a Discrete observation (gymnasium shape ()) is stored as (1,).
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 0:
        return (1,)
    return check_shape(value, name)


def _action_dim(value: Any, name: str) -> int:
    """SB3 get_action_dim from the action space's shape: Box prod(shape), Discrete () -> 1,
    MultiDiscrete (len(nvec),), MultiBinary (n,)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 0:
        return 1
    return math.prod(check_shape(value, name))


def _replay_action_dtype(dtype: np.dtype) -> np.dtype:
    # ReplayBuffer._maybe_cast_dtype: float64 actions are stored as float32, every other dtype as is.
    return FLOAT32 if dtype == _FLOAT64 else dtype


def check_steps(steps: Any) -> int | None:
    return None if steps is None else check_count(steps, "steps", minimum=0)


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

    Examples:
        >>> [f.name for f in sb3_replay_layout((4, 84, 84), "uint8", (), "int64", buffer_size=100)]
        ['observations', 'next_observations', 'actions', 'rewards', 'dones', 'timeouts']
    """
    buffer_size = check_count(buffer_size, "buffer_size")
    n_envs = check_count(n_envs, "n_envs", kind="processes")
    if optimize_memory_usage and handle_timeout_termination:
        raise EstimateError(
            "SB3's ReplayBuffer does not support optimize_memory_usage=True together with "
            "handle_timeout_termination=True; pass handle_timeout_termination=False."
        )
    obs_shape = _obs_shape(obs_shape, "obs_shape")
    obs_dtype = check_dtype(obs_dtype, "obs_dtype")
    action_dim = _action_dim(action_shape, "action_shape")
    action_dtype = _replay_action_dtype(check_dtype(action_dtype, "action_dtype"))
    rows = max(buffer_size // n_envs, 1)
    fields = [Field("observations", (rows, n_envs, *obs_shape), obs_dtype)]
    if not optimize_memory_usage:
        fields.append(Field("next_observations", (rows, n_envs, *obs_shape), obs_dtype))
    fields.append(Field("actions", (rows, n_envs, action_dim), action_dtype))
    fields.extend(Field(name, (rows, n_envs), FLOAT32) for name in ("rewards", "dones", "timeouts"))
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
    the rest is as ``sb3_replay_layout``. SB3 does not support ``optimize_memory_usage`` here.

    Args:
        obs_spaces: ``{key: (shape, dtype)}`` of the Dict observation space's sub-spaces, in order.
        action_shape, action_dtype, buffer_size, n_envs, handle_timeout_termination: As
            ``sb3_replay_layout``.
        optimize_memory_usage: Must be False (SB3 asserts it).

    Examples:
        >>> layout = sb3_dict_replay_layout({"img": ((3, 64, 64), "uint8"), "vec": ((5,), "float32")},
        ...                                 (2,), "float32", buffer_size=10)
        >>> [f.name for f in layout][:2]
        ["observations['img']", "observations['vec']"]
    """
    if optimize_memory_usage:
        raise EstimateError("SB3's DictReplayBuffer does not support optimize_memory_usage=True, but got True.")
    if not isinstance(obs_spaces, Mapping) or not obs_spaces:
        raise EstimateError(f"obs_spaces must be a non-empty dict of key -> (shape, dtype), but got {obs_spaces!r}.")
    buffer_size = check_count(buffer_size, "buffer_size")
    n_envs = check_count(n_envs, "n_envs", kind="processes")
    rows = max(buffer_size // n_envs, 1)
    obs: list[tuple[str, tuple[int, ...], np.dtype]] = []
    for key, spec in obs_spaces.items():
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise EstimateError(f"obs_spaces[{key!r}] must be (shape, dtype), but got {spec!r}.")
        obs.append(
            (
                str(key),
                _obs_shape(spec[0], f"obs_spaces[{key!r}] shape"),
                check_dtype(spec[1], f"obs_spaces[{key!r}] dtype"),
            )
        )
    action_dim = _action_dim(action_shape, "action_shape")
    action_dtype = _replay_action_dtype(check_dtype(action_dtype, "action_dtype"))
    fields = [
        Field(f"{prefix}[{key!r}]", (rows, n_envs, *shape), dtype)
        for prefix in ("observations", "next_observations")
        for key, shape, dtype in obs
    ]
    fields.append(Field("actions", (rows, n_envs, action_dim), action_dtype))
    fields.extend(Field(name, (rows, n_envs), FLOAT32) for name in ("rewards", "dones", "timeouts"))
    return fields


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

    Examples:
        >>> layout_nbytes(sb3_rollout_layout((4,), "float32", (), "int64", n_steps=2048))
        98304
    """
    n_steps = check_count(n_steps, "n_steps")
    n_envs = check_count(n_envs, "n_envs", kind="processes")
    obs_shape = _obs_shape(obs_shape, "obs_shape")
    fields = [
        Field("observations", (n_steps, n_envs, *obs_shape), check_dtype(obs_dtype, "obs_dtype")),
        Field(
            "actions",
            (n_steps, n_envs, _action_dim(action_shape, "action_shape")),
            check_dtype(action_dtype, "action_dtype"),
        ),
    ]
    fields.extend(
        Field(name, (n_steps, n_envs), FLOAT32)
        for name in ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages")
    )
    return fields


def frame_stack(obs_shape: Sequence[int], n_stack: int, *, channels_last: bool | None = None) -> tuple[int, ...]:
    """The observation shape after SB3's ``VecFrameStack(n_stack)`` (``StackedObservations.compute_stacking``).

    Frames are stacked on the channel axis: the last one for channels-last, the first for channels-first.
    ``channels_last=None`` applies SB3's rule for image spaces (3-D: channels-first when the first axis
    is the smallest); anything else stacks on the last axis. SB3 detects only uint8 ``[0, 255]`` Box
    images that way and stacks every other space on the last axis: pass ``channels_last=True`` for a 3-D
    observation that is not such an image.

    Examples:
        >>> frame_stack(ATARI_FRAME_SHAPE, 4)
        (84, 84, 4)
        >>> frame_stack((1, 84, 84), 4)
        (4, 84, 84)
    """
    shape = list(check_shape(obs_shape, "obs_shape"))
    if not shape:
        raise EstimateError(f"obs_shape must have at least one axis to stack on, but got {obs_shape!r}.")
    n_stack = check_count(n_stack, "n_stack", kind="dimension")
    if channels_last is None:
        channels_last = not (len(shape) == 3 and int(np.argmin(shape)) == 0)
    shape[-1 if channels_last else 0] *= n_stack
    return tuple(shape)
