"""Objectives, footprints and guards for the bad-input probe: module-level, so they pickle into the runner's
trial processes and load as ``memprune worker _bad_inputs.objectives:NAME``.

Each is as small as a hostile or careless user's would be; the objectives touch real memory (numpy pages).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import optuna

import optuna_memprune as omp

MiB = 2**20
BASE_MB = 150  # a trial process: interpreter, optuna, sqlalchemy, numpy (the fork server preloads them)
SPACE = {"mb": optuna.distributions.IntDistribution(8, 64)}
NOT_A_GUARD = 42


class UserError(Exception):
    """An error of the user's own code (objective, footprint): raising it through is right."""


# -- footprints ------------------------------------------------------------------------------------


def footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=(BASE_MB + params["mb"]) * MiB, name="probe baseline + mb")


def slow_footprint(params: dict) -> omp.Footprint:
    time.sleep(30)
    return footprint(params)


def raising_footprint(params: dict) -> omp.Footprint:
    raise UserError("footprint exploded")


def none_footprint(params: dict) -> None:
    return None


def dict_footprint(params: dict) -> dict:
    return {"ram": (BASE_MB + params["mb"]) * MiB}


def int_footprint(params: dict) -> int:
    return (BASE_MB + params["mb"]) * MiB


def negative_footprint(params: dict) -> omp.Footprint:
    return omp.Footprint((omp.Component("negative", omp.Kind.USER, -512 * MiB),))


def huge_footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=2**50 + params["mb"])  # a petabyte: can never fit


def conditional_footprint(params: dict) -> omp.Footprint:
    mb = params["x"] if params["kind"] == "a" else params["y"]
    return omp.Footprint.of(ram=(BASE_MB + mb) * MiB)


# -- objectives ------------------------------------------------------------------------------------


def quick(trial: optuna.Trial) -> float:
    mb = trial.suggest_int("mb", 8, 64)
    block = np.ones(mb * MiB, dtype=np.uint8)
    return float(block[::4096].sum()) / 256


def grow(trial: optuna.Trial) -> float:
    """Suggests a small ``mb`` (predicted to fit), then grows by 20 MiB every 20 ms up to 2 GiB."""
    trial.suggest_int("mb", 8, 64)
    blocks = []
    for step in range(100):
        blocks.append(np.ones(20 * MiB, dtype=np.uint8))
        trial.report(float(step), step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}")
        time.sleep(0.02)
    return 0.0


def conditional(trial: optuna.Trial) -> float:
    kind = trial.suggest_categorical("kind", ["a", "b"])
    mb = trial.suggest_int("x", 8, 64) if kind == "a" else trial.suggest_int("y", 8, 64)
    return float(mb)


def raises(trial: optuna.Trial) -> float:
    trial.suggest_int("mb", 8, 64)
    raise UserError("bad config in the objective")


def returns_nan(trial: optuna.Trial) -> float:
    trial.suggest_int("mb", 8, 64)
    return float("nan")


def returns_none(trial: optuna.Trial) -> None:
    trial.suggest_int("mb", 8, 64)


def returns_text(trial: optuna.Trial) -> str:
    trial.suggest_int("mb", 8, 64)
    return "accuracy: high"


def exits(trial: optuna.Trial) -> float:
    """Ends its process without a result (a library calling ``sys.exit`` or ``os._exit``)."""
    trial.suggest_int("mb", 8, 64)
    os._exit(3)


def leaves_grandchild(trial: optuna.Trial) -> float:
    """Starts a helper process and returns without waiting for it (a data loader left behind)."""
    trial.suggest_int("mb", 8, 64)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    return 1.0


def wait_to_be_killed(trial: optuna.Trial) -> float:
    """Writes its pid to the file ``$PROBE_MARKER`` names, then sleeps: the scenario kills it (or its runner)."""
    trial.suggest_int("mb", 8, 64)
    marker = os.environ["PROBE_MARKER"]
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    time.sleep(60)
    return 0.0


def mark_and_return(trial: optuna.Trial) -> float:
    """Writes its pid to the file ``$PROBE_MARKER`` names and returns at once."""
    trial.suggest_int("mb", 8, 64)
    marker = os.environ["PROBE_MARKER"]
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    return 1.0


# -- guards for ``memprune worker --guard`` ----------------------------------------------------------


def make_guard() -> omp.MemoryGuard:
    return omp.MemoryGuard(footprint, omp.Budget(ram="1GiB"), search_space=SPACE)


def make_slow_guard() -> omp.MemoryGuard:
    return omp.MemoryGuard(slow_footprint, omp.Budget(ram="1GiB"))
