"""Measure the forecast stop on real SB3 DQN training: how early it stops a trial whose replay buffer grows
towards a budget it would cross late, and whether it ever stops a trial whose memory plateaus.

Every run is one trial of an in-process guarded study (``MemoryGuard`` with ``horizon=None``: the horizon is
the trial's ``total_timesteps`` param), training a real ``stable_baselines3.DQN`` (MlpPolicy, CPU, one torch
thread) on a small env whose observations are ``--obs-kib`` KiB of uint8, so that each stored transition
takes ``2 x obs`` bytes (observation and next observation, filled lazily: RSS grows as the buffer fills).
A callback reports ``trial.report(..., num_timesteps)`` every 25 steps; the monitor reads every 10 ms. DQN
trains on batches of 8 every 16 steps (SB3 turns each batch into float32 copies of the observations:
transient spikes over the buffer). Kinds:

- ``grow``: ``buffer_size`` = ``total_timesteps``: the buffer grows to the end. The budget is set (from one
  calibration run without a budget) so that it is crossed at ``--cross`` (80%) of the growth.
- plateau kinds, under the same budget, which they never cross: ``ring`` (a buffer of 3% of the run, full
  early, then flat), ``warmup`` (that buffer and an allocation of 40% of the budget's room above the run's
  starting RSS at 4% of the run, kept), ``noisy`` (that buffer and 1-35% of the room allocated and freed
  at random every 100 steps). DQN's first gradient step (at step 100) allocates too: a warm-up in every run.

Each run is a process forked from this one once it has imported SB3 and trained a few steps; its budget is
its starting RSS plus ``--cross`` of the growth the calibration run measured.

It measures the growing trial's time to the budget with the forecast off (``horizon=False``: the guard's
hard stop at the budget), then its time to the forecast stop, ``--runs`` times, and runs ``--runs`` plateau
trials (the kinds in turn) with the forecast on. Times are from the objective's start to its stop.

    python scripts/bench_forecast.py [--runs 20] [--breach-runs 5] [--steps 16000] [--obs-kib 32] [--smoke]

``--steps`` is 16,000 so that the breach comes seconds in: the forecast fits no fewer than 12 readings in the
recent half of the run (0.24 s at the 10 ms readings here), and where a run of 4,000 steps breached 0.43 s in
(a faster machine than the one that took 1.9 s) that floor, not the forecast, set the stop: 0.52 of the
breach's time at 4,000 steps, 0.13 at 16,000, in one session.

Needs the ``rl`` extra (stable-baselines3, gymnasium). Prints one line per run, then the last line
``FORECAST stop_time_ratio=<median forecast stop / median breach> false_stops=<plateau runs stopped>/<m>``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import numpy as np
import optuna
import psutil

import optuna_memprune as omp
from optuna_memprune.guard import Decision, read_record

MiB = 2**20
REPORT_EVERY = 25
PLATEAUS = ("ring", "warmup", "noisy")


def make_env(obs_bytes: int):  # type: ignore[no-untyped-def]
    import gymnasium as gym

    class BigObs(gym.Env):
        """Episodes of 200 steps whose observations are ``obs_bytes`` uint8 (a constant image)."""

        observation_space = gym.spaces.Box(0, 255, (obs_bytes,), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def __init__(self) -> None:
            self._obs = np.random.default_rng(0).integers(0, 255, obs_bytes, dtype=np.uint8)
            self._t = 0

        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            super().reset(seed=seed)
            self._t = 0
            return self._obs, {}

        def step(self, action):  # type: ignore[no-untyped-def]
            self._t += 1
            return self._obs, float(action), False, self._t >= 200, {}

    return BigObs()


def head() -> type:
    """A features extractor that reads the first 64 values of the observation: the buffer stores all of it
    (what the bench measures), the network stays small (so a run takes seconds on a loaded CPU)."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class Head(BaseFeaturesExtractor):
        def __init__(self, observation_space) -> None:  # type: ignore[no-untyped-def]
            super().__init__(observation_space, 64)

        def forward(self, observations):  # type: ignore[no-untyped-def]
            return observations[:, :64]

    return Head


def objective(trial: optuna.Trial, obs_bytes: int, room: int) -> float:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    kind = trial.suggest_categorical("kind", ("grow",) + PLATEAUS)
    steps = trial.suggest_int("total_timesteps", 100, 10**7)
    buffer_size = steps if kind == "grow" else max(steps * 3 // 100, 200)
    rng = random.Random(trial.number)
    extra: list[np.ndarray] = []

    class Report(BaseCallback):
        def _on_step(self) -> bool:
            n = self.num_timesteps
            if kind == "warmup" and n == steps * 4 // 100:
                extra.append(np.ones(room * 4 // 10, dtype=np.uint8))
            if kind == "noisy" and n % 100 == 0:
                extra.clear()
                extra.append(np.ones(int(room * rng.uniform(0.01, 0.35)), dtype=np.uint8))
            if n % REPORT_EVERY == 0:
                trial.report(float(n), n)
            return True

    start = time.perf_counter()
    model = DQN(
        "MlpPolicy",
        make_env(obs_bytes),
        buffer_size=buffer_size,
        learning_starts=100,
        batch_size=8,
        train_freq=16,
        policy_kwargs={"net_arch": [64], "features_extractor_class": head()},
        device="cpu",
        seed=trial.number,
        verbose=0,
    )
    try:
        model.learn(steps, callback=Report())
    except optuna.TrialPruned:
        trial.set_user_attr("elapsed_s", time.perf_counter() - start)
        raise
    finally:
        del model
        extra.clear()
        gc.collect()
    trial.set_user_attr("elapsed_s", time.perf_counter() - start)
    return 0.0


SPACE = {
    "kind": optuna.distributions.CategoricalDistribution(("grow",) + PLATEAUS),
    "total_timesteps": optuna.distributions.IntDistribution(100, 10**7),
}


def run(kind: str, steps: int, obs_bytes: int, room: int, horizon: object) -> dict:
    """One trial of ``kind`` in a fresh study, in a process forked from this one (every run starts from the
    same memory, imports loaded), with a budget ``room`` bytes over its RSS at the start. Returns its record's
    decision, reason, peak and budget, its last step and the seconds from the objective's start to its end."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the run's process
        os.close(read)
        code = 1
        try:
            out = _run_here(kind, steps, obs_bytes, room, horizon)
            os.write(write, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the {kind} run's process ended with status {status} and no result")
    return json.loads(data)


def _run_here(kind: str, steps: int, obs_bytes: int, room: int, horizon: object) -> dict:
    base = psutil.Process().memory_info().rss
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=base),
        omp.Budget(ram=base + room),
        monitor_interval=0.01,
        horizon=horizon,
        search_space=SPACE,
    )
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
    study.enqueue_trial({"kind": kind, "total_timesteps": steps})
    study.optimize(guard.wrap_objective(lambda t: objective(t, obs_bytes, room)), n_trials=1)
    (trial,) = study.trials
    record = read_record(trial.user_attrs)
    return {
        "decision": record.decision.value,
        "reason": record.reason,
        "peak": record.peak_ram,
        "budget": record.budget_ram,
        "start": base,
        "step": trial.last_step,
        "seconds": float(trial.user_attrs.get("elapsed_s", float("nan"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="growing runs, and plateau runs (default 20 each)")
    parser.add_argument("--breach-runs", type=int, default=5, help="growing runs with the forecast off")
    parser.add_argument("--steps", type=int, default=16000, help="total_timesteps of every run")
    parser.add_argument("--obs-kib", type=int, default=32, help="KiB of one observation")
    parser.add_argument("--cross", type=float, default=0.8, help="share of the growth at which the budget lies")
    parser.add_argument("--smoke", action="store_true", help="2 runs of each kind, 1 breach run, 2,000 steps")
    args = parser.parse_args()
    # SB3 makes a folder SB3-<date> in the temporary directory at every learn() without a log folder (45 a run
    # here): this run's go in one folder of its own, removed at the end
    if "SB3_LOGDIR" not in os.environ:
        os.environ["SB3_LOGDIR"] = tempfile.mkdtemp(prefix="bench-forecast-sb3-")
        atexit.register(shutil.rmtree, os.environ["SB3_LOGDIR"], True)
    if args.smoke:
        args.runs, args.breach_runs, args.steps = 2, 1, 2000
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import torch

    torch.set_num_threads(1)
    obs_bytes = args.obs_kib * 1024

    # warm up here (imports, torch's first training step): every run is forked from this process
    from stable_baselines3 import DQN

    warm = DQN(
        "MlpPolicy",
        make_env(obs_bytes),
        buffer_size=200,
        learning_starts=100,
        batch_size=8,
        policy_kwargs={"net_arch": [64], "features_extractor_class": head()},
        device="cpu",
        verbose=0,
    )
    warm.learn(300)
    del warm
    gc.collect()
    # calibrate the growth of a growing run under a budget it cannot reach
    cal = run("grow", args.steps, obs_bytes, 64 * 2**30, False)
    room = int(args.cross * (cal["peak"] - cal["start"]))
    print(
        f"calibration: RSS {cal['start'] / MiB:.0f} -> {cal['peak'] / MiB:.0f} MiB over {args.steps:,} steps in "
        f"{cal['seconds']:.1f} s; budget: a run's starting RSS + {room / MiB:.0f} MiB ({args.cross:.0%} of the "
        "growth)",
        flush=True,
    )

    def grow(label: str, n: int, horizon: object, wanted: Decision) -> tuple[list[float], list[int], int]:
        """``n`` growing runs: seconds and steps of those that ended ``wanted``, and how many did not."""
        seconds, steps = [], []
        for i in range(n):
            r = run("grow", args.steps, obs_bytes, room, horizon)
            print(
                f"{label} {i}: {r['decision']} at step {r['step']} after {r['seconds']:.2f} s"
                + (f": {r['reason']}" if horizon is None else ""),
                flush=True,
            )
            if r["decision"] == wanted.value:
                seconds.append(r["seconds"])
                steps.append(r["step"])
        return seconds, steps, n - len(seconds)

    breach, breach_steps, _ = grow("breach", args.breach_runs, False, Decision.STOPPED)
    stops, stop_steps, missed = grow("grow", args.runs, None, Decision.FORECAST_STOPPED)

    false_stops = 0
    for i in range(args.runs):
        kind = PLATEAUS[i % len(PLATEAUS)]
        r = run(kind, args.steps, obs_bytes, room, None)
        stopped = r["decision"] in (Decision.FORECAST_STOPPED.value, Decision.STOPPED.value)
        false_stops += r["decision"] == Decision.FORECAST_STOPPED.value
        print(
            f"plateau {i} ({kind}): {r['decision']}, peak {r['peak'] / MiB:.0f} MiB of {r['budget'] / MiB:.0f}, "
            f"{r['seconds']:.2f} s{': ' + r['reason'] if stopped else ''}",
            flush=True,
        )

    ratio = statistics.median(stops) / statistics.median(breach) if stops and breach else float("nan")
    if missed:
        print(f"{missed} of {args.runs} growing runs were not stopped on the forecast")
    print(
        f"breach median {statistics.median(breach) if breach else float('nan'):.2f} s over {len(breach)} runs; "
        f"forecast stop median {statistics.median(stops) if stops else float('nan'):.2f} s over {len(stops)} runs"
    )
    if stops and breach:
        print(
            f"in steps: forecast stop median {statistics.median(stop_steps):,.0f}, breach median "
            f"{statistics.median(breach_steps):,.0f} of {args.steps:,} (ratio "
            f"{statistics.median(stop_steps) / statistics.median(breach_steps):.3f})"
        )
    print(f"FORECAST stop_time_ratio={ratio:.3f} false_stops={false_stops}/{args.runs}")


if __name__ == "__main__":
    main()
