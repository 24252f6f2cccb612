"""A study whose script calls optimize at import (no ``if __name__ == "__main__":``) with n_jobs=2: a trial's
process importing it would run the study again, so memprune run keeps its trials as threads of its process."""

import numpy as np
import optuna


def objective(trial: optuna.Trial) -> float:
    buffer_size = trial.suggest_int("buffer_size", 10_000, 1_000_000, log=True)
    return float(np.ones((buffer_size, 8), dtype=np.float32).sum())


optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
study.optimize(objective, n_trials=4, n_jobs=2)
print(f"trials {len(study.trials)}")
