"""Buffer layouts and fill models checked against real SB3 buffers, a real deque and real RSS."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer, RolloutBuffer
from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

from optuna_memprune.estimate import Kind, buffers
from optuna_memprune.estimate.buffers import (
    ATARI_FRAME_DTYPE, ATARI_FRAME_SHAPE, FillCurve, array, deque_buffer, deque_fill_curve, frame_stack,
    layout_nbytes, measure_object_overheads, replay_buffer, replay_fill_curve, rollout_buffer,
    sb3_dict_replay_layout, sb3_replay_layout, sb3_rollout_layout,
)
from optuna_memprune.exceptions import EstimateError

ROOT = Path(__file__).resolve().parents[2]
ATARI_OBS = (4, 84, 84)  # VecFrameStack(4) + VecTransposeImage, as DQN's CnnPolicy stores it

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


def assert_layout_matches(layout: list[buffers.Field], buffer: object) -> None:
    arrays = real_arrays(buffer)
    assert [f.name for f in layout] == [n for n in arrays if n in {f.name for f in layout}]
    assert {f.name for f in layout} == set(arrays), "a real array is missing from the layout or vice versa"
    for field in layout:
        real = arrays[field.name]
        assert (field.shape, field.dtype, field.nbytes) == (real.shape, real.dtype, real.nbytes), field.name
    assert layout_nbytes(layout) == sum(a.nbytes for a in arrays.values())


def run_python(script: str, *args: str, timeout: float = 120) -> dict:
    """Run a script in a fresh interpreter (so RSS is its own) and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def host_huge_pages() -> bool:
    """Whether numpy's large arrays get transparent huge pages here (THP 'always' or 'madvise')."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


# ------------------------------------------------------------------------------------ layouts vs SB3


@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
def test_replay_layout_equals_real_sb3_arrays(obs: str, action: str, optimize: bool, n_envs: int) -> None:
    obs_space, action_space = OBS_SPACES[obs], ACTION_SPACES[action]
    real = ReplayBuffer(103, obs_space, action_space, device="cpu", n_envs=n_envs,
                        optimize_memory_usage=optimize, handle_timeout_termination=not optimize)
    layout = sb3_replay_layout(*spec(obs_space), *spec(action_space), buffer_size=103, n_envs=n_envs,
                               optimize_memory_usage=optimize, handle_timeout_termination=not optimize)
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
        "actions"] == np.float64  # RolloutBuffer keeps the action dtype as is


@pytest.mark.parametrize("n_envs", [1, 4])
def test_large_atari_replay_layout_equals_real_sb3(n_envs: int) -> None:
    # 20,000 x (4, 84, 84) uint8 twice is 1.13 GB, but np.zeros maps it lazily: creating it is cheap.
    obs_space = spaces.Box(0, 255, ATARI_OBS, np.uint8)
    real = ReplayBuffer(20_000, obs_space, spaces.Discrete(6), device="cpu", n_envs=n_envs)
    assert_layout_matches(sb3_replay_layout(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, n_envs=n_envs),
                          real)


@pytest.mark.parametrize("n_envs", [1, 4])
def test_dict_replay_layout_equals_real_sb3(n_envs: int) -> None:
    obs_space = spaces.Dict({"img": OBS_SPACES["image"], "vec": OBS_SPACES["vector"], "d": OBS_SPACES["discrete"]})
    real = DictReplayBuffer(50, obs_space, ACTION_SPACES["box64"], device="cpu", n_envs=n_envs)
    layout = sb3_dict_replay_layout({k: spec(s) for k, s in obs_space.spaces.items()}, *spec(ACTION_SPACES["box64"]),
                                    buffer_size=50, n_envs=n_envs)
    assert_layout_matches(layout, real)
    fp = replay_buffer(None, None, (3,), "float64", buffer_size=50, n_envs=n_envs,
                       dict_obs={k: spec(s) for k, s in obs_space.spaces.items()})
    assert fp.components[0].note.startswith("RSS full")


@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
@pytest.mark.parametrize("obs", sorted(OBS_SPACES))
def test_rollout_layout_equals_real_sb3_arrays(obs: str, action: str, n_envs: int) -> None:
    obs_space, action_space = OBS_SPACES[obs], ACTION_SPACES[action]
    real = RolloutBuffer(16, obs_space, action_space, device="cpu", n_envs=n_envs)
    layout = sb3_rollout_layout(*spec(obs_space), *spec(action_space), n_steps=16, n_envs=n_envs)
    assert_layout_matches(layout, real)
    assert rollout_buffer(*spec(obs_space), *spec(action_space), n_steps=16, n_envs=n_envs).components[0].ram == \
        layout_nbytes(layout)


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
    assert gb(buffer_size=1_000_000, optimize_memory_usage=True, handle_timeout_termination=False) == \
        pytest.approx(28.2, abs=0.1)
    assert gb(buffer_size=100_000) == pytest.approx(5.6, abs=0.1)
    # Allocated (what SB3's own check should have counted) includes the never-written timeouts.
    layout = sb3_replay_layout(ATARI_OBS, "uint8", (), "int64", buffer_size=1_000_000,
                               optimize_memory_usage=True, handle_timeout_termination=False)
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
    opt = {p.name: p for p in replay_fill_curve((1000,), "float32", (), "int64", buffer_size=1000,
                                                optimize_memory_usage=True,
                                                handle_timeout_termination=False).parts}
    assert opt["observations"].ram(0) == 4096 and opt["timeouts"].ram(1000) == 0
    # Huge pages: a big array may have up to one 2 MiB page more than it touched, a small one has pages.
    big = {p.name: p.ram(1) for p in replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000,
                                                       huge_pages=True).parts}
    assert big["observations"] == 7 * 4096 + 2 * 1024 * 1024 - 4096
    assert big["rewards"] == 4096
    assert replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, huge_pages=True).full == \
        replay_fill_curve(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000).full
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


@pytest.mark.parametrize(("n_steps", "n_envs", "batch"), [
    (128, 8, 64),     # swap_and_flatten copy of the observations dominates
    (128, 8, None),   # A2C: one minibatch of the whole buffer, copied by numpy and by torch
    (1024, 1, 256),   # n_envs == 1: no flatten copy (views); three minibatches' worth live
])
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


@pytest.mark.parametrize(("shape", "dtype", "maxlen", "extra"), [
    ((4, 84, 84), "uint8", 20_000, 0),      # Atari frames: the data dominates
    ((4,), "float32", 200_000, 50_000),     # CartPole: the object overheads dominate; full, then evicting
])
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
    ring_shared = replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=20_000, optimize_memory_usage=True,
                                handle_timeout_termination=False).ram
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


# ------------------------------------------------------------------------------------ misc and bad input


def test_array() -> None:
    assert array((1000, 1000), "float32").ram == math.ceil(4e6 / 4096) * 4096
    assert array((1000, 1000), "float32", touched=0.5).ram == math.ceil(2e6 / 4096) * 4096
    assert array((10,), np.uint8, name="x").components[0].name == "x"


def bad(call, *words: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, EstimateError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_input_names_argument_and_value() -> None:
    atari = (ATARI_OBS, "uint8", (), "int64")
    bad(lambda: replay_buffer(*atari, buffer_size=0), "buffer_size", "0")
    bad(lambda: replay_buffer(*atari, buffer_size=-5), "buffer_size", "-5")
    bad(lambda: replay_buffer(*atari, buffer_size=1.5), "buffer_size", "1.5")
    bad(lambda: replay_buffer(*atari, buffer_size=10, n_envs=0), "n_envs", "0")
    bad(lambda: replay_buffer(ATARI_OBS, "uint9", (), "int64", buffer_size=10), "obs_dtype", "uint9")
    bad(lambda: replay_buffer(ATARI_OBS, None, (), "int64", buffer_size=10), "obs_dtype", "None")
    bad(lambda: replay_buffer(ATARI_OBS, "uint8", (), object, buffer_size=10), "action_dtype")
    bad(lambda: replay_buffer((4, 0), "uint8", (), "int64", buffer_size=10), "obs_shape", "(4, 0)")
    bad(lambda: replay_buffer(*atari, buffer_size=10, steps=-1), "steps", "-1")
    bad(lambda: replay_buffer(*atari, buffer_size=10, optimize_memory_usage=True), "handle_timeout_termination")
    bad(lambda: replay_buffer(*atari, buffer_size=10, batch_size=0), "batch_size", "0")
    bad(lambda: replay_buffer(*atari, buffer_size=10, device="tpu"), "device", "tpu")
    bad(lambda: replay_buffer(*atari, buffer_size=10, dict_obs={"a": ((2,), "float32")}), "dict_obs", "obs_shape")
    bad(lambda: sb3_dict_replay_layout({"a": ((2,), "float32")}, (), "int64", buffer_size=10,
                                       optimize_memory_usage=True), "optimize_memory_usage")
    bad(lambda: sb3_dict_replay_layout({"a": (2,)}, (), "int64", buffer_size=10), "obs_spaces['a']")
    bad(lambda: rollout_buffer(*atari, n_steps=0), "n_steps", "0")
    bad(lambda: rollout_buffer(*atari, n_steps=8, n_envs=True), "n_envs", "True")
    bad(lambda: deque_buffer([((4,), "float32"), "reward"], maxlen=10), "transition[1]", "reward")
    bad(lambda: deque_buffer([], maxlen=10), "transition", "[]")
    bad(lambda: deque_buffer([float], maxlen=0), "maxlen", "0")
    bad(lambda: deque_buffer([float], maxlen=10, overheads={"float": 24}), "overheads")
    bad(lambda: array((4,), "float32", touched=1.5), "touched", "1.5")
    bad(lambda: frame_stack((84, 84, 1), 0), "n_stack", "0")


def test_integral_floats_from_yaml_are_accepted() -> None:
    assert replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=1e5).ram == \
        replay_buffer(ATARI_OBS, "uint8", (), "int64", buffer_size=100_000).ram


def test_exported_lazily_and_pure() -> None:
    from optuna_memprune import estimate

    assert estimate.replay_buffer is replay_buffer and estimate.deque_buffer is deque_buffer
    out = run_python("""
        import json, sys
        import optuna_memprune.estimate.buffers
        print(json.dumps({"mods": sorted(m for m in ("torch", "psutil", "optuna", "gymnasium") if m in sys.modules)}))
    """)
    assert out["mods"] == []


def test_docstring_examples_run() -> None:
    assert doctest.testmod(buffers).failed == 0
