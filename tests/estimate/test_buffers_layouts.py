"""Buffer layouts checked against real SB3 buffers' arrays, published figures and SB3's frame stacking."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _buffers_common import ATARI_OBS
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer, RolloutBuffer
from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

from optuna_memprune.estimate.buffers import (
    ATARI_FRAME_DTYPE,
    ATARI_FRAME_SHAPE,
    Field,
    frame_stack,
    layout_nbytes,
    replay_buffer,
    rollout_buffer,
    sb3_dict_replay_layout,
    sb3_replay_layout,
    sb3_rollout_layout,
)

OBS_SPACES = {
    "image": spaces.Box(0, 255, (3, 10, 12), np.uint8),
    "vector": spaces.Box(-1.0, 1.0, (5,), np.float32),
    "discrete": spaces.Discrete(7),
}
ACTION_SPACES = {
    "discrete": spaces.Discrete(6),
    "box32": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "box64": spaces.Box(-1.0, 1.0, (3,), np.float64),
    "multidiscrete": spaces.MultiDiscrete([3, 4, 5]),
    "multibinary": spaces.MultiBinary(4),
}


def spec(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """The test's own adapter from a gymnasium space to (shape, dtype)."""
    return space.shape, space.dtype


def real_arrays(buffer: object) -> dict[str, np.ndarray]:
    """Every ndarray a real SB3 buffer holds, named as the layouts name them."""
    out = {}
    for attr, value in vars(buffer).items():
        if isinstance(value, np.ndarray):
            out[attr] = value
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            out.update({f"{attr}[{key!r}]": v for key, v in value.items()})
    return out


def assert_layout_matches(layout: list[Field], buffer: object) -> None:
    arrays = real_arrays(buffer)
    assert [f.name for f in layout] == [n for n in arrays if n in {f.name for f in layout}]
    assert {f.name for f in layout} == set(arrays), "a real array is missing from the layout or vice versa"
    for field in layout:
        real = arrays[field.name]
        assert (field.shape, field.dtype, field.nbytes) == (real.shape, real.dtype, real.nbytes), field.name
    assert layout_nbytes(layout) == sum(a.nbytes for a in arrays.values())


# ------------------------------------------------------------------------------------ layouts vs SB3


@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
def test_replay_layout_equals_real_sb3_arrays(obs: str, action: str, optimize: bool, n_envs: int) -> None:
    obs_space, action_space = OBS_SPACES[obs], ACTION_SPACES[action]
    real = ReplayBuffer(
        103,
        obs_space,
        action_space,
        device="cpu",
        n_envs=n_envs,
        optimize_memory_usage=optimize,
        handle_timeout_termination=not optimize,
    )
    layout = sb3_replay_layout(
        *spec(obs_space),
        *spec(action_space),
        buffer_size=103,
        n_envs=n_envs,
        optimize_memory_usage=optimize,
        handle_timeout_termination=not optimize,
    )
    assert_layout_matches(layout, real)
    assert ("next_observations" in real_arrays(real)) is (not optimize)


def test_replay_layout_buffer_smaller_than_envs_keeps_one_row() -> None:
    real = ReplayBuffer(2, OBS_SPACES["vector"], ACTION_SPACES["discrete"], device="cpu", n_envs=4)
    layout = sb3_replay_layout((5,), "float32", (), "int64", buffer_size=2, n_envs=4)
    assert_layout_matches(layout, real)
    assert layout[0].shape == (1, 4, 5)


def test_replay_layout_casts_float64_actions_only() -> None:
    dtypes = {f.name: f.dtype for f in sb3_replay_layout((5,), "float32", (3,), "float64", buffer_size=8)}
    assert dtypes["actions"] == np.float32
    assert {f.name: f.dtype for f in sb3_rollout_layout((5,), "float32", (3,), "float64", n_steps=8)}[
        "actions"
    ] == np.float64  # RolloutBuffer keeps the action dtype as is


@pytest.mark.parametrize("n_envs", [1, 4])
def test_large_atari_replay_layout_equals_real_sb3(n_envs: int) -> None:
    # 20,000 x (4, 84, 84) uint8 twice is 1.13 GB, but np.zeros maps it lazily: creating it is cheap.
    obs_space = spaces.Box(0, 255, ATARI_OBS, np.uint8)
    real = ReplayBuffer(20_000, obs_space, spaces.Discrete(6), device="cpu", n_envs=n_envs)
    assert_layout_matches(sb3_replay_layout(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, n_envs=n_envs), real)


@pytest.mark.parametrize("n_envs", [1, 4])
def test_dict_replay_layout_equals_real_sb3(n_envs: int) -> None:
    obs_space = spaces.Dict({"img": OBS_SPACES["image"], "vec": OBS_SPACES["vector"], "d": OBS_SPACES["discrete"]})
    real = DictReplayBuffer(50, obs_space, ACTION_SPACES["box64"], device="cpu", n_envs=n_envs)
    layout = sb3_dict_replay_layout(
        {k: spec(s) for k, s in obs_space.spaces.items()}, *spec(ACTION_SPACES["box64"]), buffer_size=50, n_envs=n_envs
    )
    assert_layout_matches(layout, real)
    fp = replay_buffer(
        None,
        None,
        (3,),
        "float64",
        buffer_size=50,
        n_envs=n_envs,
        dict_obs={k: spec(s) for k, s in obs_space.spaces.items()},
    )
    assert fp.components[0].note.startswith("RSS full")


@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
def test_rollout_layout_equals_real_sb3_arrays(obs: str, action: str, n_envs: int) -> None:
    obs_space, action_space = OBS_SPACES[obs], ACTION_SPACES[action]
    real = RolloutBuffer(16, obs_space, action_space, device="cpu", n_envs=n_envs)
    layout = sb3_rollout_layout(*spec(obs_space), *spec(action_space), n_steps=16, n_envs=n_envs)
    assert_layout_matches(layout, real)
    assert rollout_buffer(*spec(obs_space), *spec(action_space), n_steps=16, n_envs=n_envs).components[
        0
    ].ram == layout_nbytes(layout)


# ------------------------------------------------------------------------------------ published figures


def test_dqn_atari_buffer_figures_from_facts() -> None:
    # FACTS.md: DQN's default 1e6 Atari buffer ~56.4 GB, ~28.2 GB with optimize_memory_usage; zoo's 1e5 ~5.6 GB.
    def gb(**kw: object) -> float:
        return replay_buffer(ATARI_OBS, "uint8", (), "int64", **kw).ram / 1e9

    exact = 2 * 28_224 * 10**6 + 8 * 10**6 + 3 * 4 * 10**6
    assert layout_nbytes(sb3_replay_layout(ATARI_OBS, "uint8", (), "int64", buffer_size=1_000_000)) == exact
    full = replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=1_000_000).ram
    assert 0 <= full - exact < 6 * 4096  # each of the six arrays rounded up to whole pages
    assert gb(buffer_size=1_000_000) == pytest.approx(56.4, abs=0.1)
    assert gb(buffer_size=1_000_000, optimize_memory_usage=True, handle_timeout_termination=False) == pytest.approx(
        28.2, abs=0.1
    )
    assert gb(buffer_size=100_000) == pytest.approx(5.6, abs=0.1)
    # Allocated (what SB3's own check should have counted) includes the never-written timeouts.
    layout = sb3_replay_layout(
        ATARI_OBS,
        "uint8",
        (),
        "int64",
        buffer_size=1_000_000,
        optimize_memory_usage=True,
        handle_timeout_termination=False,
    )
    assert layout_nbytes(layout) == 28_224 * 10**6 + 8 * 10**6 + 3 * 4 * 10**6


def test_atari_frame_stack_matches_sb3() -> None:
    stacked = frame_stack(ATARI_FRAME_SHAPE, 4)
    assert stacked == (84, 84, 4)
    assert math.prod(stacked) * np.dtype(ATARI_FRAME_DTYPE).itemsize == 28_224
    cases = [
        (spaces.Box(0, 255, (84, 84, 1), np.uint8), None),
        (spaces.Box(0, 255, (1, 84, 84), np.uint8), None),
        (spaces.Box(0, 255, (3, 64, 64), np.uint8), None),
        (spaces.Box(-1.0, 1.0, (5,), np.float32), None),
        (spaces.Box(0, 255, (84, 84, 1), np.uint8), "first"),
        (spaces.Box(0, 255, (1, 84, 84), np.uint8), "last"),
    ]
    for space, order in cases:
        sb3 = StackedObservations(2, 4, space, order).stacked_observation_space.shape
        ours = frame_stack(space.shape, 4, channels_last=None if order is None else order == "last")
        assert ours == sb3, (space, order)
