"""The deque-of-tuples model checked against a real deque's RSS and a numpy ring buffer."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _buffers_common import ATARI_OBS, run_python

from optuna_memprune.estimate.buffers import deque_buffer, deque_fill_curve, measure_object_overheads, replay_buffer

# ------------------------------------------------------------------------------------ deque of tuples


def test_measured_overheads_are_plausible_and_json_ready() -> None:
    ov = measure_object_overheads()
    assert json.loads(json.dumps(ov)) == ov
    assert ov["tuple_per_item"] == np.dtype(np.intp).itemsize
    assert ov["small_int_max"] == 256 and ov["bool"] == 0 and ov["numpy_scalars"]["bool"] == 0
    assert ov["ndarray_object"] == np.ndarray.__basicsize__
    assert ov["deque_block_items"] == 64 and ov["deque_block"] == (64 + 2) * np.dtype(np.intp).itemsize
    assert ov["float"] == sys.getsizeof(1.5)


DEQUE_FILL = """
import collections, json, random, sys
import numpy as np
from optuna_memprune.estimate.buffers import measure_object_overheads

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

shape, dtype, maxlen, extra = tuple(json.loads(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pool = [np.random.default_rng(i).integers(0, 256, shape).astype(dtype) for i in range(16)]
rng = random.Random(0)
memory = collections.deque(maxlen=maxlen)
start = rss()
for i in range(maxlen + extra):  # the tutorial DQN: (obs, action, reward, next_obs, done)
    memory.append((pool[i % 16].copy(), rng.randrange(6), rng.random(), pool[(i + 1) % 16].copy(),
                   rng.random() < 0.01))
grown = rss() - start
print(json.dumps({"grown": grown, "overheads": measure_object_overheads()}))  # as the calibration does
"""


@pytest.mark.parametrize(
    ("shape", "dtype", "maxlen", "extra"),
    [
        ((4, 84, 84), "uint8", 20_000, 0),  # Atari frames: the data dominates
        ((4,), "float32", 200_000, 50_000),  # CartPole: the object overheads dominate; full, then evicting
    ],
)
def test_deque_rss_matches_model(shape: tuple[int, ...], dtype: str, maxlen: int, extra: int) -> None:
    out = run_python(DEQUE_FILL, json.dumps(shape), dtype, str(maxlen), str(extra))
    transition = [(shape, dtype), int, float, (shape, dtype), bool]
    predicted = deque_buffer(transition, maxlen=maxlen, overheads=out["overheads"]).ram
    assert out["grown"] == pytest.approx(predicted, rel=0.05)
    assert deque_buffer(transition, maxlen=maxlen).ram == predicted  # in-process defaults agree


def test_deque_versus_numpy_ring_buffer() -> None:
    obs = (ATARI_OBS, "uint8")
    deque_ram = deque_buffer([obs, int, float, obs, bool], maxlen=20_000).ram
    ring = replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000).ram
    ring_shared = replay_buffer(
        ATARI_OBS,
        "uint8",
        (),
        "int64",
        buffer_size=20_000,
        optimize_memory_usage=True,
        handle_timeout_termination=False,
    ).ram
    # obs and next_obs as separate arrays: every frame twice, like SB3 without optimize_memory_usage.
    assert 1.0 < deque_ram / ring < 1.01
    assert 1.99 < deque_ram / ring_shared < 2.02
    # next_obs being the next transition's obs object (listed as None): the frames count once.
    assert deque_buffer([obs, int, float, None, bool], maxlen=20_000).ram / ring_shared == pytest.approx(1, abs=0.01)


def test_deque_fill_and_items() -> None:
    transition = [((4,), "float32"), np.int64, float, ((4,), "float32"), np.bool_]
    curve = deque_fill_curve(transition, maxlen=1000)
    assert curve.ram(0) > 0  # the deque's first block
    assert curve.ram(500) < curve.ram(1000) == curve.full == curve.ram(5000)
    fp = deque_buffer(transition, maxlen=1000, steps=500)
    assert fp.ram == curve.ram(500) and "500 of 1,000 tuples" in fp.components[0].note
    assert deque_buffer([((4,), "float32"), int], maxlen=1).ram < deque_buffer([((4,), "float32"), float], maxlen=1).ram
