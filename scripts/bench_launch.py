"""How fast ``omp.optimize`` starts a trial in its own process, with torch loaded as in a real study.

Runs 21 sequential trials of a trivial objective on a SQLite study. For each, the time from the parent's
``study.ask()`` (the trial's ``datetime_start``) to the objective's first line in the child covers the
pre-launch check, the ledger's admission, the fork from the server and the child opening the storage.
The fork server (it imports torch) starts before the first trial is asked; ``server_start_s`` is the time
from the ``optimize`` call to the first trial's first line, the server's start included.

Last line: ``LAUNCH server_start_s=<x> start_median_ms=<x> start_p90_ms=<x> per_trial_ms=<x>``.

    python scripts/bench_launch.py
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
import optuna

import optuna_memprune as omp

N_TRIALS = 21


def objective(trial: optuna.Trial) -> float:
    trial.set_user_attr("t_first_line", time.time())
    return float(trial.suggest_int("n", 1, 100))


def main() -> None:
    import torch  # noqa: F401 - a real study's parent has it loaded, so the fork server preloads it

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram="600MiB"), omp.Budget(ram="2GiB"))
    with tempfile.TemporaryDirectory(prefix="memprune-bench-launch-") as tmp:
        study = optuna.create_study(
            storage=f"sqlite:///{tmp}/launch.db", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
        )
        ledger = omp.Ledger(omp.HostBudget(ram="4GiB", gpus=None), url=f"sqlite:///{tmp}/ledger.sqlite")
        t0 = time.time()
        omp.optimize(study, objective, guard=guard, n_trials=N_TRIALS, host=ledger, show_progress_bar=False)
        wall = time.time() - t0
        starts = [t.user_attrs["t_first_line"] - t.datetime_start.timestamp() for t in study.trials]
        first = study.trials[0].user_attrs["t_first_line"] - t0
    later = np.array(starts[1:]) * 1000
    print(
        f"{N_TRIALS} trials in {wall:.1f} s; optimize -> the first trial's first line {first:.2f} s (the fork "
        f"server's start included); ask -> objective's first line: first trial {starts[0]:.2f} s, then median "
        f"{np.median(later):.0f} ms",
        file=sys.stderr,
    )
    print(
        f"LAUNCH server_start_s={first:.2f} start_median_ms={np.median(later):.0f} "
        f"start_p90_ms={np.percentile(later, 90):.0f} per_trial_ms={(wall - first) / (N_TRIALS - 1) * 1000:.0f}"
    )


if __name__ == "__main__":
    main()
