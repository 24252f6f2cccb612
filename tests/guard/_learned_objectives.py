"""Objectives for the learned footprint's tests: module-level, so they pickle into the runner's children.

Each touches real memory driven by its params (numpy pages written), with no footprint function anywhere.
"""

from __future__ import annotations

import time

import numpy as np
import optuna

MiB = 2**20


def alloc(trial: optuna.Trial) -> float:
    """``mb`` MiB written and held 0.1 s; ``lr`` takes no memory."""
    mb = trial.suggest_int("mb", 8, 480, log=True)
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    block = np.ones(mb * MiB, dtype=np.uint8)
    time.sleep(0.1)
    return float(block[::4096].sum()) * lr


def alloc_then_pruned(trial: optuna.Trial) -> float:
    """``mb`` MiB written and held 1.2 s, then pruned as a study's pruner prunes (its RSS settled long before)."""
    mb = trial.suggest_int("mb", 8, 480, log=True)
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    block = np.ones(mb * MiB, dtype=np.uint8)
    time.sleep(1.2)
    trial.report(float(block[::4096].sum()), 0)
    raise optuna.TrialPruned()


def alloc_held(trial: optuna.Trial) -> float:
    """``mb`` MiB written and held 4 s where ``seed`` is 1 or 3 (a long trial; 3 then stops the study), else
    0.1 s; ``seed`` takes no memory."""
    mb = trial.suggest_int("mb", 8, 480, log=True)
    seed = trial.suggest_int("seed", 0, 9)
    block = np.ones(mb * MiB, dtype=np.uint8)
    time.sleep(4.0 if seed in (1, 3) else 0.1)
    if seed == 3:
        trial.study.stop()
    return float(block[::4096].sum())
