"""Objectives and footprints for the Ray backend's tests: module-level, so Ray's workers import them (the
tests put this directory on the workers' PYTHONPATH). Each holds real memory (numpy pages touched).
"""

from __future__ import annotations

import os
import time

import numpy as np
import optuna

MiB = 2**20


def footprint(params: dict) -> object:
    """The trial's process (a Ray worker forked: interpreter, Ray, Optuna; about 150 MiB) plus ``mb``, and
    ``threads`` threads."""
    import optuna_memprune as omp

    return omp.Footprint.of(ram=(150 + params["mb"]) * MiB, threads=params.get("threads", 1))


def hold(trial: optuna.Trial, together: bool = False) -> float:
    """Touch ``mb`` MiB and hold them for a second, reporting once through the storage; records when it ran
    and the process it was started from (a Ray task's worker). ``together``: while another trial of the study
    is running, hold on until one has reported too (at most a minute), so two trials Ray runs at once overlap
    however long a loaded host takes to start the second's worker."""
    started = time.time()
    mb = trial.suggest_int("mb", 8, 3000)
    block = np.ones(mb * MiB, dtype=np.uint8)
    trial.report(float(mb), 0)
    time.sleep(1.0)
    deadline = time.time() + 60.0
    while together and time.time() < deadline:
        others = [t for t in trial.study.get_trials(deepcopy=False) if t.number != trial.number]
        if any(t.intermediate_values for t in others) or not any(t.state.name == "RUNNING" for t in others):
            break
        time.sleep(0.1)
    trial.set_user_attr("ran", [started, time.time()])
    trial.set_user_attr("parent", os.getppid())
    return float(block[:: 4096 * 16].sum() // 16 or mb)


def hold_or_grow(trial: optuna.Trial) -> float:
    """:func:`hold` (``together``), or where ``grow`` is True: a small ``mb`` (predicted to fit), then 20 MiB more every 20 ms
    until stopped."""
    if not trial.suggest_categorical("grow", [False, True]):
        return hold(trial, together=True)
    trial.suggest_int("mb", 8, 3000)
    blocks = []
    for _ in range(200):
        blocks.append(np.ones(20 * MiB, dtype=np.uint8))
        time.sleep(0.02)
    return 0.0


def hold_long(trial: optuna.Trial) -> float:
    """Hold ``mb`` MiB: report once (the test then knows it runs), then wait a minute for the node to die;
    a trial that is not large finishes at once."""
    mb = trial.suggest_int("mb", 8, 3000)
    block = np.ones(mb * MiB, dtype=np.uint8)
    trial.report(float(mb), 0)
    if mb >= 500:
        time.sleep(60.0)
    return float(block[0])
