"""The forecast of a trial's RSS at its last step, on synthetic timelines: growth is stopped early with the
right projection; a plateau (a ring buffer that filled, a warm-up allocation) and a noisy flat line never are.

Each timeline is evaluated as the guard evaluates a running trial: on every prefix, as if the run were there.
"""

from __future__ import annotations

import random
import re
import time

import pytest

import optuna_memprune as omp
from optuna_memprune.guard._forecast_stop import StepForecast, check_horizon, describe, resolve_horizon
from optuna_memprune.monitor import forecast

MiB = 2**20
HORIZON = 10_000
RATE = 100  # steps a second
READS = 10  # readings a second
LIMIT = 1000 * MiB


def _run(rss_at_step, seconds: float = HORIZON / RATE, noise: float = 0.0, seed: int = 0):
    """Readings ``(t, rss)`` at 10 Hz and step marks ``(t, step)`` each second of a run of ``HORIZON`` steps."""
    rng = random.Random(seed)
    points = [
        (i / READS, int(rss_at_step(i / READS * RATE) + rng.gauss(0, noise))) for i in range(int(seconds * READS))
    ]
    marks = [(float(t), t * RATE) for t in range(int(seconds) + 1)]
    return points, marks


def _first_stop(points, marks, limit=LIMIT):
    """The first forecast that stops the run, evaluated at every new step mark, as the guard does."""
    for k in range(2, len(marks)):
        t = marks[k - 1][0]
        f = forecast([p for p in points if p[0] <= t], marks[:k], HORIZON, limit)
        if f is not None and f.over:
            return f
    return None


def test_linear_growth_is_stopped_early_with_the_projection_at_the_last_step() -> None:
    # 200 MiB, then 0.09 MiB a step: crosses 1000 MiB at step 8,889, near the end of the run.
    points, marks = _run(lambda s: 200 * MiB + 0.09 * MiB * s, noise=2 * MiB)
    f = _first_stop(points, marks)
    assert f is not None and f.over
    assert 1_000 <= f.step <= 1_500  # as soon as a tenth of the run is seen (not before), not at step 8,889
    assert f.projected == pytest.approx(200 * MiB + 0.09 * MiB * HORIZON, rel=0.02)  # 1,100 MiB
    assert f.projected_low > LIMIT and f.slope_low <= f.slope
    assert f.at(8_889) == pytest.approx(LIMIT, rel=0.02)
    text = describe(f, LIMIT)
    assert re.match(
        r"stopped on the forecast: projected 1\.(0[6-9]|10) GiB at step 10,000 > 1000\.00 MiB; "
        r"at step 1,\d{3} now \(RSS [23]\d\d\.\d\d MiB, \+9\d\.\d\d KiB a step\)$",
        text,
    ), text


def test_growth_that_stays_under_the_limit_is_not_stopped() -> None:
    points, marks = _run(lambda s: 200 * MiB + 0.07 * MiB * s, noise=2 * MiB)  # 900 MiB at the end
    assert _first_stop(points, marks) is None


@pytest.mark.parametrize(
    "name, rss",
    [
        # a ring buffer of 600 MiB filling over the first 400 steps (its growth, extrapolated, is 15 GiB)
        ("ring buffer", lambda s: 200 * MiB + 1.5 * MiB * min(s, 400)),
        # a warm-up allocation of 700 MiB at step 800, then flat
        ("warm-up", lambda s: 200 * MiB + (700 * MiB if s >= 800 else 0)),
        # a sawtooth: 300 MiB allocated and freed every 200 steps (a periodic batch, a collector)
        ("sawtooth", lambda s: 500 * MiB + 1.5 * MiB * (s % 200)),
    ],
)
def test_a_plateau_is_never_stopped(name: str, rss) -> None:
    for seed in range(5):
        points, marks = _run(rss, noise=3 * MiB, seed=seed)
        assert _first_stop(points, marks) is None, name


def test_a_buffer_still_filling_at_a_tenth_of_the_run_is_growth() -> None:
    # The documented limit: a buffer that fills until step 3,000 (30% of the run) is, at step 1,000, growth that
    # crosses the limit if it goes on; the forecast cannot know it will stop, and stops it.
    points, marks = _run(lambda s: 200 * MiB + 0.5 * MiB * min(s, 3_000), noise=3 * MiB)
    f = _first_stop(points, marks)
    assert f is not None and f.step < 1_500


def test_a_noisy_flat_line_near_the_limit_is_never_stopped() -> None:
    for seed in range(20):
        points, marks = _run(lambda s: 950 * MiB, noise=20 * MiB, seed=seed)
        assert _first_stop(points, marks) is None, seed


def test_no_forecast_before_anything_to_fit_or_past_the_horizon() -> None:
    points, marks = _run(lambda s: 200 * MiB + 0.09 * MiB * s)
    assert forecast(points, marks[:1], HORIZON, LIMIT) is None  # one mark: no rate
    assert forecast(points[:5], marks[:2], HORIZON, LIMIT) is None  # too few readings
    assert forecast(points, marks, 50, LIMIT) is None  # the horizon is behind
    early = forecast([p for p in points if p[0] <= 5], marks[:6], HORIZON, LIMIT)
    assert early is not None and not early.over and "of the run observed" in early.held


def test_the_guard_side_reads_the_step_now_and_then_and_fires_once() -> None:
    points, marks = _run(lambda s: 200 * MiB + 0.09 * MiB * s)
    clock = {"t": 0.0}
    step_at = dict(marks)

    def read():
        return int(clock["t"]) * RATE if clock["t"] >= 0 else None, {"lr": 0.1}

    sf = StepForecast(LIMIT, HORIZON, read)
    sf.start = 0.0
    sf._next_poll = 0.0
    fired = []
    for t, rss in points:
        clock["t"] = t
        f = sf.on_reading(t, rss)
        if f is not None:
            fired.append(f)
    assert len(fired) == 1 and fired[0].step in step_at.values() and fired[0].step < 2_000
    assert sf.reason().startswith("stopped on the forecast: projected ")
    record = sf.record()
    assert record["horizon"] == HORIZON and record["limit"] == LIMIT and record["projected"] > LIMIT


def _reads(
    horizon: object, burn_s: float | list[float], params: dict, at_launch: dict | None = None
) -> tuple[int, int | None]:
    """A trial read by ``StepForecast`` at a reading every 0.1 s for 1 s, each read burning ``burn_s`` of CPU
    (the n-th read the n-th of a list) and giving ``params``: how many reads were made, and the horizon found."""
    calls = []

    def read():
        burn = burn_s[len(calls)] if isinstance(burn_s, list) else burn_s
        calls.append(1)
        end = time.thread_time() + burn
        while time.thread_time() < end:
            pass
        return None, params

    sf = StepForecast(LIMIT, horizon, read, at_launch)
    sf.start = sf._next_poll = 0.0
    for i in range(10):
        sf.on_reading(0.1 * i, 100 * MiB)
    return len(calls), sf.horizon


def test_the_trial_is_read_no_sooner_than_fifty_times_the_cpu_of_the_cheaper_of_the_last_two_reads() -> None:
    assert _reads(HORIZON, 0.0, {})[0] == 10  # an in-memory read: microseconds, at every reading
    # 4 ms of CPU (a database's): after the second read, the next 0.2 s or more later
    assert 3 <= _reads(HORIZON, 0.004, {})[0] <= 6
    # one costly read (a new storage's first query, a garbage collection) holds back no later one: 80 ms put
    # the next read 4 s later, and a trial growing 2 MiB a step was stopped at step 291 of 400 instead of 40
    assert _reads(HORIZON, [0.08] + [0.0] * 9, {})[0] == 10
    assert _reads(HORIZON, [0.0, 0.0, 0.08] + [0.0] * 7, {})[0] == 10


def test_a_trial_with_no_horizon_yet_is_read_for_one_much_later() -> None:
    """``horizon=None`` and no step-count param: a read only looks for one (a param the objective may
    suggest later), so a costly read waits 1000 times its CPU; a horizon in the params known at launch is
    taken at once and the trial is read at the usual pace."""
    assert _reads(None, 0.004, {"lr": 0.1}) == (1, None)  # 4 ms of CPU: the next look 4 s later
    assert _reads(None, 0.0, {"lr": 0.1}) == (10, None)  # in memory: still at every reading
    for at_launch in (None, {"n_timesteps": 1000}):  # found by the first read, or known at launch
        found, horizon = _reads(None, 0.004, {"lr": 0.1, "n_timesteps": 1000}, at_launch)
        assert horizon == 1000 and 3 <= found <= 6  # then read for its steps at the usual pace
    # horizon="steps", a param that is there but no step count: no forecast, nothing more to read
    sf = StepForecast(LIMIT, "steps", lambda: (None, {"steps": "all"}))
    sf.start = sf._next_poll = 0.0
    sf.on_reading(0.0, 100 * MiB)
    assert sf._next_poll == float("inf")


def test_horizon_is_checked_and_resolved_per_trial() -> None:
    for bad in (0, -5, 2.5, "", True, [100]):
        with pytest.raises(ValueError, match=r"^horizon must be None, False, a positive int"):
            check_horizon(bad)
    with pytest.raises(ValueError, match="horizon must be"):
        omp.MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), horizon=0)
    assert omp.MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), horizon="steps").horizon == "steps"
    assert resolve_horizon(None, {"total_timesteps": 5_000}) == 5_000
    assert resolve_horizon(None, {"lr": 0.1}) is None
    assert resolve_horizon(False, {"n_timesteps": 5_000}) is None
    assert resolve_horizon(lambda p: p["n"] * 10, {"n": 7}) == 70
    assert resolve_horizon("n", {"n": 0}) is None  # not a positive int: no forecast for that trial
    with pytest.raises(ValueError, match="^horizon must be a positive int, but got 0"):
        forecast([], [], 0, LIMIT)
