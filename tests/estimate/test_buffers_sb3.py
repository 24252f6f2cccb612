"""SB3 buffers' Footprints: get() and sample() copies against measured peaks, a lone array, YAML floats."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _buffers_common import ATARI_OBS, run_python

from optuna_memprune.estimate import Kind
from optuna_memprune.estimate.buffers import array, replay_buffer, rollout_buffer

# ------------------------------------------------------------------------------------ rollout get()


ROLLOUT_GET = """
import json, sys
import numpy as np, torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))

n_steps, n_envs = int(sys.argv[1]), int(sys.argv[2])
batch = None if sys.argv[3] == "None" else int(sys.argv[3])
buf = RolloutBuffer(n_steps, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cpu",
                    n_envs=n_envs)
for dtype in (np.uint8, np.float32, np.int64):  # torch's first-use allocations are not the buffer's
    th.tensor(np.zeros((64, 4), dtype)), th.tensor(np.zeros(64, dtype)[np.arange(8)].astype(np.float32))
pool = np.random.default_rng(0).integers(0, 256, (8, n_envs, 4, 84, 84), dtype=np.uint8)
zeros = np.zeros(n_envs, np.int64), np.zeros(n_envs, np.float32), np.zeros(n_envs, bool)
for i in range(n_steps):
    buf.add(pool[i % 8], *zeros, th.zeros(n_envs), th.zeros(n_envs))
buf.compute_returns_and_advantage(th.zeros(n_envs), np.zeros(n_envs))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the present RSS
before = status("VmRSS")
assert status("VmHWM") - before < 1 << 20, "VmHWM was not reset"
for rollout_data in buf.get(batch):  # as PPO's train(): the loop variable holds the previous batch
    pass
print(json.dumps({"peak": status("VmHWM") - before}))
"""


@pytest.mark.parametrize(
    ("n_steps", "n_envs", "batch"),
    [
        (128, 8, 64),  # swap_and_flatten copy of the observations dominates
        (128, 8, None),  # A2C: one minibatch of the whole buffer, copied by numpy and by torch
        (1024, 1, 256),  # n_envs == 1: no flatten copy (views); three minibatches' worth live
    ],
)
def test_rollout_get_peak_matches_measured(n_steps: int, n_envs: int, batch: int | None) -> None:
    measured = run_python(ROLLOUT_GET, str(n_steps), str(n_envs), str(batch))["peak"]
    fp = rollout_buffer(ATARI_OBS, "uint8", (), "int64", n_steps=n_steps, n_envs=n_envs, batch_size=batch)
    copies = fp.components[1]
    assert copies.kind is Kind.TEMPORARIES and copies.vram == 0
    assert measured == pytest.approx(copies.ram, rel=0.05), copies.note


def test_rollout_get_model_cases() -> None:
    obs_bytes = 128 * 8 * 28_224
    fp = rollout_buffer(ATARI_OBS, "uint8", (), "int64", n_steps=128, n_envs=8, batch_size=64)
    assert fp.components[1].ram == obs_bytes and "swap_and_flatten" in fp.components[1].note
    single = rollout_buffer(ATARI_OBS, "uint8", (), "int64", n_steps=128, n_envs=1, batch_size=32)
    per_item = 28_224 + 4 + 16
    assert single.components[1].ram == 32 * per_item * 3
    whole = rollout_buffer(ATARI_OBS, "uint8", (), "int64", n_steps=128, n_envs=8)
    assert whole.components[1].ram == 2 * 128 * 8 * per_item
    cuda = rollout_buffer(ATARI_OBS, "uint8", (), "int64", n_steps=128, n_envs=1, batch_size=32, device="cuda:0")
    assert (cuda.components[1].ram, cuda.components[1].vram) == (32 * per_item, 2 * 32 * per_item)


def test_replay_sample_copies_component() -> None:
    fp = replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=1000, batch_size=32)
    sample = fp.components[1]
    assert sample.kind is Kind.TEMPORARIES and sample.ram == 2 * 32 * (2 * 28_224 + 8 + 8)
    assert len(replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=1000).components) == 1


def test_array() -> None:
    assert array((1000, 1000), "float32").ram == math.ceil(4e6 / 4096) * 4096
    assert array((1000, 1000), "float32", touched=0.5).ram == math.ceil(2e6 / 4096) * 4096
    assert array((10,), np.uint8, name="x").components[0].name == "x"


def test_integral_floats_from_yaml_are_accepted() -> None:
    assert (
        replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=1e5).ram
        == replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=100_000).ram
    )
