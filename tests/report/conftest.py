"""A real guarded study on SQLite, built once per session: admitted, clamped, rejected, soft-pruned and
stopped trials from real allocations against a budget set above this process's present RSS."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import optuna
import psutil
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

import optuna_memprune as omp
from optuna_memprune.guard import MemoryGuard

MiB = 2**20
SOFT = 0.8
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _rss() -> int:
    return psutil.Process().memory_info().rss


def build_guarded_study(path: Path, name: str = "guarded") -> str:
    """Seven trials on a SQLite file; returns the storage URL. Trial numbers and what they become:
    0, 1, 4 admitted; 2 clamped (b lowered); 3 rejected (a alone is over); 5 soft-pruned (holds RSS
    between the soft line and the budget); 6 stopped (grows past the budget). The two that end over the
    soft line come last: nothing runs after them in a process whose RSS they raised."""
    start = _rss()
    line = start + 256 * MiB  # the soft line
    budget = omp.Budget(ram=int(line / SOFT), threads=512)
    space = {
        "mode": CategoricalDistribution(["ok", "soft", "leak"]),
        "a": IntDistribution(1, 400),
        "b": IntDistribution(100, 1000),
    }
    base: list[int] = []

    def footprint(p: dict) -> omp.Footprint:
        # What this process holds when the first trial is checked, the trial's arrays, and 32 MiB for the
        # storage's and Optuna's own growth while trials run: a + b up to about 190 fits under the soft line.
        base[:] = base or [_rss()]
        return omp.Footprint.of(ram=base[0] + 32 * MiB, threads=8, name="process") + omp.Footprint.of(
            ram=(p["a"] + p["b"]) * MiB, name="arrays"
        )

    guard = MemoryGuard(footprint, budget, clamp=["b"], search_space=space, soft=SOFT, monitor_interval=0.05)

    def objective(trial: optuna.Trial) -> float:
        mode = trial.suggest_categorical("mode", ["ok", "soft", "leak"])
        a, b = trial.suggest_int("a", 1, 400), trial.suggest_int("b", 100, 1000)
        held = []
        if mode == "ok":
            held.append(np.ones((a + b) * MiB, dtype=np.uint8))
            time.sleep(0.3)  # several monitor readings of the held memory
            return float(a + b)
        # Grow past the soft line (soft) or past the budget (leak), 1 GiB at most, then hold until the guard
        # acts, however late a loaded machine's monitor thread reads: the pruner answers True (soft) or the
        # trial is interrupted (leak; no should_prune() here, or the soft line could answer first).
        stop_at = line + 24 * MiB if mode == "soft" else budget.ram + 64 * MiB
        while _rss() < stop_at and len(held) < 128:
            held.append(np.ones(8 * MiB, dtype=np.uint8))
        for _ in range(200):
            time.sleep(0.05)
            if mode == "soft" and trial.should_prune():
                raise optuna.TrialPruned()
        raise AssertionError(f"the guard did not act on trial {trial.number} ({mode}) in 10 s")

    url = f"sqlite:///{path}"
    study = optuna.create_study(
        study_name=name,
        storage=url,
        direction="minimize",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=3)),
        pruner=guard.wrap_pruner(None),
    )
    for params in (
        {"mode": "ok", "a": 20, "b": 100},
        {"mode": "ok", "a": 40, "b": 120},
        {"mode": "ok", "a": 60},
        {"mode": "ok", "a": 400},
        {"mode": "ok", "a": 30, "b": 110},
        {"mode": "soft", "a": 10, "b": 100},
        {"mode": "leak", "a": 10, "b": 100},
    ):
        study.enqueue_trial(params)
    study.optimize(guard.wrap_objective(objective), n_trials=7)
    return url


@pytest.fixture(scope="session")
def guarded_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_guarded_study(tmp_path_factory.mktemp("report") / "guarded.db")
