"""Objectives for the forecast stop in the process-per-trial runner: module-level, so they pickle into the
children. Real numpy pages, a step reported with each allocation."""

from __future__ import annotations

import time

import numpy as np
import optuna

MiB = 2**20


def footprint(params: dict) -> "object":
    """The child's baseline (interpreter, optuna, what the fork server preloads) and a little: the trial fits."""
    import optuna_memprune as omp

    return omp.Footprint.of(ram=300 * MiB)


def grow_steps(trial: optuna.Trial) -> float:
    """Runs ``n_timesteps`` steps of 10 ms, 2 MiB more each, reporting every step."""
    steps = trial.suggest_categorical("n_timesteps", [400])
    held = []
    for step in range(steps):
        held.append(np.ones(2 * MiB, dtype=np.uint8))
        time.sleep(0.01)
        trial.report(float(step), step)
    return float(len(held))
