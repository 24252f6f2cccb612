"""The fill model checked by hand and against a real SB3 replay buffer's RSS as it fills."""

from __future__ import annotations

from pathlib import Path

import pytest
from _buffers_common import ATARI_OBS, run_python

from optuna_memprune.estimate import Kind
from optuna_memprune.estimate.buffers import FillCurve, replay_buffer, replay_fill_curve


def host_huge_pages() -> bool:
    """Whether numpy's large arrays get transparent huge pages here (THP 'always' or 'madvise')."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


# ------------------------------------------------------------------------------------ fill model


def test_fill_curve_rows_pages_and_inverse() -> None:
    curve = replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000)
    assert isinstance(curve, FillCurve) and curve.steps_to_full == 20_000
    assert curve.ram(0) == 0
    assert curve.ram() == curve.ram(20_000) == curve.ram(10**9) == curve.full
    one = curve.ram(1)  # one row of every array, each rounded up to whole 4 KiB pages
    assert one == 2 * 7 * 4096 + 4 * 4096  # 28,224 B -> 7 pages; actions, rewards, dones, timeouts 1 each
    values = [curve.ram(s) for s in range(0, 20_001, 997)]
    assert values == sorted(values)
    for target in (1, one, one + 1, curve.full // 3, curve.full):
        steps = curve.steps_for(target)
        assert curve.ram(steps) >= target and (steps == 0 or curve.ram(steps - 1) < target)
    assert curve.steps_for(curve.full + 1) is None


def test_fill_curve_details() -> None:
    # n_envs: one row per add() of n_envs transitions; a partial add still writes a whole row.
    curve = replay_fill_curve((1000,), "float32", (), "int64", buffer_size=4000, n_envs=4)
    assert curve.ram(4) == curve.ram(1) and curve.ram(5) > curve.ram(4)
    # optimize_memory_usage writes next_obs into the following row; timeouts stay untouched (no RSS).
    opt = {
        p.name: p
        for p in replay_fill_curve(
            (1000,),
            "float32",
            (),
            "int64",
            buffer_size=1000,
            optimize_memory_usage=True,
            handle_timeout_termination=False,
        ).parts
    }
    assert opt["observations"].ram(0) == 4096 and opt["timeouts"].ram(1000) == 0
    # Huge pages: a big array may have up to one 2 MiB page more than it touched, a small one has pages.
    big = {
        p.name: p.ram(1)
        for p in replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, huge_pages=True).parts
    }
    assert big["observations"] == 7 * 4096 + 2 * 1024 * 1024 - 4096
    assert big["rewards"] == 4096
    assert (
        replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, huge_pages=True).full
        == replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000).full
    )
    fp = replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, steps=5_000)
    assert fp.ram == replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000).ram(5_000)
    assert "after 5,000 of 20,000 transitions" in fp.components[0].note
    assert fp.components[0].kind is Kind.BUFFER


SB3_FILL = """
import json, sys
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

capacity, checkpoints = int(sys.argv[1]), [int(a) for a in sys.argv[2:]]
obs_space, action_space = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)
pool = np.random.default_rng(0).integers(0, 256, (17, 1, 4, 84, 84), dtype=np.uint8)
action, reward, done, infos = np.array([[1]]), np.array([0.5], np.float32), np.array([False]), [{}]
warm = ReplayBuffer(4, obs_space, action_space, device="cpu")  # run every code path once, elsewhere
warm.add(pool[0], pool[1], action, reward, done, infos)
buf = ReplayBuffer(capacity, obs_space, action_space, device="cpu")
start, out, added = rss(), {}, 0
for target in checkpoints:
    while added < target:
        buf.add(pool[added % 17], pool[(added + 1) % 17], action, reward, done, infos)
        added += 1
    out[target] = rss() - start
print(json.dumps(out))
"""


def test_sb3_replay_fill_rss_matches_model() -> None:
    grown = {int(k): v for k, v in run_python(SB3_FILL, "20000", "300", "5000", "20000").items()}
    curve = replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000)
    bound = replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, huge_pages=True)
    for steps in (5_000, 20_000):  # both models within 5% once the buffer holds real data
        assert grown[steps] == pytest.approx(curve.ram(steps), rel=0.05), (steps, grown, curve.ram(steps))
        assert grown[steps] == pytest.approx(bound.ram(steps), rel=0.05), (steps, grown, bound.ram(steps))
    assert grown[20_000] == pytest.approx(curve.full, rel=0.01)
    # Early on, where huge pages are on here, each array grows in 2 MiB steps: the bound holds, 4 KiB pages don't.
    model = bound if host_huge_pages() else curve
    assert model.ram(300) >= grown[300] * 0.98 and model.ram(300) <= grown[300] * 1.3, (grown[300], model.ram(300))
