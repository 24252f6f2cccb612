"""The README's example study without any guard code: a real Optuna study whose trials allocate memory.

``python example_study.py STORAGE [N_JOBS] [EXIT_STATUS]`` (STORAGE ``-`` for in memory); prints the best params on
stdout, pickles the study as rl-zoo3 does, and exits with EXIT_STATUS (default 0).
"""

import pickle
import sys

import numpy as np
import optuna


def objective(trial: optuna.Trial) -> float:
    buffer_size = trial.suggest_int("buffer_size", 10_000, 1_000_000, log=True)
    batch_size = trial.suggest_categorical("batch_size", [32, 64, 128, 256])
    learning_rate = trial.suggest_float("learning_rate", 1e-5, 1e-3, log=True)
    buffer = np.ones((buffer_size, 8), dtype=np.float32)  # about 32 bytes a transition: up to 32 MiB
    for step in range(3):
        trial.report(float(buffer[: batch_size * (step + 1)].sum()) * learning_rate, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return float(buffer.sum()) * learning_rate


if __name__ == "__main__":
    storage = None if sys.argv[1] == "-" else sys.argv[1]
    n_jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage,
        study_name="example",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=optuna.pruners.MedianPruner(),
    )
    study.optimize(objective, n_trials=4, n_jobs=n_jobs)
    pickle.loads(pickle.dumps(study))
    print(f"best {sorted(study.best_params)}")
    sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
