"""SB3's replay and rollout buffers, and a lone numpy array, as Footprints (RSS and minibatch copies).

Owns the buffers' components, their notes and the sample()/get() copy peaks (layouts and fill curves come from
``layouts`` and ``fill``); knows nothing of the deque model, gymnasium, torch, psutil or Optuna.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...exceptions import EstimateError
from ...units import format_bytes
from ..checks import check_number
from ..footprint import Component, Footprint, Kind
from .fill import FillCurve, replay_curve, replay_parts
from .layouts import (
    FLOAT32,
    PAGE_SIZE,
    Field,
    check_count,
    check_dtype,
    check_shape,
    check_steps,
    layout_nbytes,
    round_up,
    sb3_rollout_layout,
)

__all__ = ["replay_buffer", "rollout_buffer", "array"]

# SB3 RolloutBuffer.get(): the arrays swap_and_flatten() replaces, in the order it replaces them.
_ROLLOUT_FLATTENED = ("observations", "actions", "values", "log_probs", "advantages", "returns")


def _device_is_cuda(device: Any) -> bool:
    text = str(device)
    if text == "cpu":
        return False
    if text.startswith("cuda"):
        return True
    raise EstimateError(f"device must be 'cpu' or 'cuda[:N]', but got {device!r}.")


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
        obs_shape: The observation space's shape; None with ``dict_obs``.
        obs_dtype: The observation space's dtype; None with ``dict_obs``.
        action_shape: The action space's shape (see ``sb3_replay_layout``).
        action_dtype: The action space's dtype.
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

    Examples:
        >>> fp = replay_buffer((4, 84, 84), "uint8", (), "int64", buffer_size=1_000_000)
        >>> round(fp.ram / 1e9, 2)
        56.47
    """
    steps = check_steps(steps)
    fields, rows, n_envs = replay_parts(
        obs_shape,
        obs_dtype,
        action_shape,
        action_dtype,
        buffer_size=buffer_size,
        n_envs=n_envs,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=handle_timeout_termination,
        dict_obs=dict_obs,
    )
    curve = replay_curve(
        fields,
        rows,
        n_envs,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=handle_timeout_termination,
        huge_pages=huge_pages,
        name=name,
    )
    components = [
        Component(name, Kind.BUFFER, ram=curve.ram(steps), note=_fill_note(curve, layout_nbytes(fields), steps))
    ]
    cuda = _device_is_cuda(device)
    if batch_size is not None:
        batch = check_count(batch_size, "batch_size", kind="dimension")
        # _get_samples: observations and next observations, actions, dones * (1 - timeouts), rewards.
        per_row = {f.name: f.nbytes // (f.shape[0] * f.shape[1]) for f in fields}
        obs = sum(v for k, v in per_row.items() if k.startswith("observations"))
        per_item = 2 * obs + per_row["actions"] + 2 * FLOAT32.itemsize
        ram, vram = _batch_copies(per_item, batch, live_batches=1, cuda=cuda)
        components.append(
            Component(
                f"{name} sample() copies",
                Kind.TEMPORARIES,
                ram=ram,
                vram=vram,
                note=f"{batch:,} x {per_item:,} B as numpy copies, then as torch tensors on {device}",
            )
        )
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
        obs_shape: The observation space's shape (see ``sb3_rollout_layout``).
        obs_dtype: The observation space's dtype.
        action_shape: The action space's shape.
        action_dtype: The action space's dtype.
        n_steps: Steps per env per rollout; >= 1.
        n_envs: Parallel envs; >= 1. Default 1.
        batch_size: The minibatch size given to ``get()`` (PPO's ``batch_size``); None: the whole buffer.
        device: ``"cpu"`` or ``"cuda[:N]"``: where the minibatch torch tensors live.
        name: The components' name.

    Examples:
        >>> fp = rollout_buffer((4, 84, 84), "uint8", (), "int64", n_steps=128, n_envs=8, batch_size=256)
        >>> print(" + ".join(c.name for c in fp.components))
        rollout buffer + rollout buffer get() copies
    """
    fields = sb3_rollout_layout(obs_shape, obs_dtype, action_shape, action_dtype, n_steps=n_steps, n_envs=n_envs)
    n_steps, n_envs = fields[0].shape[0], fields[0].shape[1]
    by_name = {f.name: f for f in fields}
    flatten = max(by_name[k].nbytes for k in _ROLLOUT_FLATTENED) if n_envs > 1 else 0
    total = n_steps * n_envs
    batch = total if batch_size is None else min(check_count(batch_size, "batch_size", kind="dimension"), total)
    live = 2 if -(-total // batch) > 1 else 1
    # _get_samples: observations, actions cast to float32, values, log_probs, advantages, returns.
    obs_item = by_name["observations"].nbytes // total
    per_item = obs_item + by_name["actions"].shape[2] * FLOAT32.itemsize + 4 * FLOAT32.itemsize
    ram, vram = _batch_copies(per_item, batch, live_batches=live, cuda=_device_is_cuda(device))
    if flatten >= ram:
        peak, why = flatten, f"swap_and_flatten copy of the largest array ({format_bytes(flatten)})"
    else:
        peak, why = ram, (f"minibatch copies: {batch:,} x {per_item:,} B as numpy, {live} live as torch on {device}")
    return Footprint(
        (
            Component(
                name,
                Kind.BUFFER,
                ram=layout_nbytes(fields),
                note=f"{n_steps:,} steps x {n_envs} envs, filled every rollout",
            ),
            Component(f"{name} get() copies", Kind.TEMPORARIES, ram=peak, vram=vram, note=f"peak of get(): {why}"),
        )
    )


def array(
    shape: Sequence[int], dtype: Any, *, name: str = "array", touched: float = 1.0, kind: Kind = Kind.BUFFER
) -> Footprint:
    """One numpy array: RSS of the ``touched`` fraction of its bytes, rounded up to pages.

    Examples:
        >>> array((1000, 1000), "float32").ram
        4001792
    """
    dims = check_shape(shape, "shape")
    field = Field(name, dims, check_dtype(dtype, "dtype"))
    check_number(touched, "touched", minimum=0, maximum=1)
    ram = min(round_up(math.ceil(field.nbytes * touched), PAGE_SIZE), round_up(field.nbytes, PAGE_SIZE))
    note = f"{'x'.join(map(str, dims))} {field.dtype.name}, {format_bytes(field.nbytes)}"
    if touched < 1.0:
        note += f", {touched:.0%} touched"
    return Footprint((Component(name, Kind(kind), ram=ram, note=note),))
