"""Objectives for the forecast stop: module-level, so they pickle into the runner's children; and the
in-process study, run in a fresh interpreter of its own. Real pages, a step reported with each allocation."""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np
import optuna

MiB = 2**20


def footprint(params: dict) -> object:
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


STEPS = 300


def _block(size: int) -> mmap.mmap:
    """``size`` bytes of fresh anonymous memory, every page written: the RSS grows by ``size`` whatever the
    heap of this process holds free."""
    block = mmap.mmap(-1, size)
    block.write(b"\1" * size)
    return block


def grow_or_plateau(trial: optuna.Trial) -> float:
    """``grow``: 1 MiB more every step (300 MiB at step 300); ``plateau``: 200 MiB in the first 15 steps (a
    ring buffer filling), then flat. Reports every step."""
    kind = trial.suggest_categorical("kind", ["grow", "plateau"])
    held = []
    for step in range(STEPS):
        if kind == "grow" or step < 15:
            held.append(_block(MiB if kind == "grow" else 200 * MiB // 15))
        time.sleep(0.01)
        trial.report(float(len(held)), step)
    return float(len(held))


def in_process_study(url: str) -> int:
    """A growing trial, then a plateauing one, in this process under a budget 280 MiB above its RSS (the
    growing trial would cross it at about step 280 of 300). Returns the budget.

    Run in an interpreter of its own (``python _forecast_objectives.py URL``): in a test process the RSS also
    moves with whatever earlier tests left running there (threads of a client, a heap being trimmed), and the
    forecast reads it.
    """
    import psutil
    from optuna.distributions import CategoricalDistribution

    import optuna_memprune as omp
    from optuna_memprune.guard._start import give_back

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    give_back()  # the process as the guard's first trial start leaves it (garbage collected, heap trimmed)
    base = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=base + 280 * MiB)
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=base),
        budget,
        horizon=STEPS,
        monitor_interval=0.02,
        search_space={"kind": CategoricalDistribution(["grow", "plateau"])},
    )
    study = optuna.create_study(
        storage=url, study_name="forecast", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler())
    )
    study.enqueue_trial({"kind": "grow"})
    study.enqueue_trial({"kind": "plateau"})
    study.optimize(guard.wrap_objective(grow_or_plateau), n_trials=2)
    return int(budget.ram)


if __name__ == "__main__":
    print(in_process_study(sys.argv[1]))
