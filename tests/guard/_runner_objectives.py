"""Objectives for the process-per-trial runner's tests: module-level, so they pickle into the children.

Each allocates real memory driven by its params (numpy pages touched), and some report where they ran.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import optuna

MiB = 2**20


def footprint(params: dict, base: int = 260) -> "object":
    """A baseline (the child: interpreter, optuna, torch preloaded by the fork server) plus the param."""
    import optuna_memprune as omp

    return omp.Footprint.of(ram=(base + params["mb"]) * MiB)


def found_pandas(trial: optuna.Trial) -> float:
    """1.0 where the trial's process had pandas imported before the trial ran (this module never imports it)."""
    import sys

    trial.suggest_int("mb", 8, 64)
    return float("pandas" in sys.modules)


def hold(trial: optuna.Trial, seconds: float = 0.3) -> float:
    """Touch ``mb`` MiB, hold them ``seconds``, report where and when it ran."""
    mb = trial.suggest_int("mb", 8, 512)
    trial.set_user_attr("ran_mb", mb)
    trial.set_user_attr("t_run", [time.time()])
    block = np.ones(mb * MiB, dtype=np.uint8)
    time.sleep(seconds)
    trial.set_user_attr("t_run", [trial.user_attrs["t_run"][0], time.time()])
    trial.set_user_attr("cuda_visible", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return float(block[::4096].sum() // (4096 * 1) or mb)


def grow(trial: optuna.Trial) -> float:
    """Suggests a small ``mb`` (predicted to fit) but then grows by 20 MiB every 20 ms until stopped."""
    trial.suggest_int("mb", 8, 64)
    blocks = []
    for _ in range(200):
        blocks.append(np.ones(20 * MiB, dtype=np.uint8))
        time.sleep(0.02)
    return 0.0


def grow_to_soft(trial: optuna.Trial) -> float:
    """Grows by 10 MiB a step up to 450 MiB over its baseline, asking should_prune() as it goes."""
    mb = trial.suggest_int("mb", 8, 64)
    blocks = [np.ones(mb * MiB, dtype=np.uint8)]
    for step in range(100):
        trial.report(float(step), step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}")
        if step < 45:
            blocks.append(np.ones(10 * MiB, dtype=np.uint8))
        time.sleep(0.05)
    return 1.0


def wait_to_be_killed(trial: optuna.Trial) -> float:
    """Writes its pid to the file named by $MEMPRUNE_TEST_MARKER and sleeps: the test kills it (or its
    runner) from outside."""
    marker = os.environ["MEMPRUNE_TEST_MARKER"]
    trial.suggest_int("mb", 8, 64)
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(60)
    return 0.0


def crash(trial: optuna.Trial) -> float:
    """Dies from a signal of its own (as a segfault would)."""
    trial.suggest_int("mb", 8, 64)
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(5)
    return 0.0


def raise_value_error(trial: optuna.Trial) -> float:
    trial.suggest_int("mb", 8, 64)
    raise ValueError("bad config in the objective")


def stop_study(trial: optuna.Trial) -> float:
    """Asks the study to stop after this trial (``trial.study.stop()``, as under Study.optimize)."""
    trial.suggest_int("mb", 8, 64)
    trial.study.stop()
    return 1.0


def guard() -> "object":
    """The guard a `memprune worker --guard _runner_objectives:guard` builds (the same as the flags
    --footprint _runner_objectives:footprint --ram 600MiB --on-infeasible reject)."""
    import optuna_memprune as omp

    return omp.MemoryGuard(footprint, omp.Budget(ram="600MiB"), on_infeasible="reject")


def nap(trial: optuna.Trial) -> float:
    """Sleeps a second without touching the study's storage (a storage error in it is the runner's alone)."""
    time.sleep(1.0)
    return 1.0


def fixed_footprint(params: dict) -> "object":
    import optuna_memprune as omp

    return omp.Footprint.of(ram=300 * MiB)


def nap_with(trial: optuna.Trial, ballast: bytes) -> float:
    """``nap`` with a large argument: the trial's process takes a while to read its payload."""
    return nap(trial)
