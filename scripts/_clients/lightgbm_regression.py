"""LightGBM tuned with Optuna on generated data: rows, num_leaves, max_bin and a learning rate, ten boosting
rounds a trial.

Settings from the environment: N_TRIALS, N_JOBS, SEED, OPTUNA_STORAGE (in memory when unset), STUDY_NAME.
"""

import os

import lightgbm as lgb
import numpy as np
import optuna

N_TRIALS = int(os.environ.get("N_TRIALS", "20"))
N_JOBS = int(os.environ.get("N_JOBS", "1"))
SEED = int(os.environ.get("SEED", "0"))
FEATURES = 40


def make_data(rows, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, FEATURES))
    y = X[:, :5] @ np.arange(1.0, 6.0) + np.sin(3 * X[:, 5]) + 0.1 * rng.standard_normal(rows)
    return X, y


def objective(trial):
    rows = trial.suggest_int("rows", 10_000, 600_000, log=True)
    params = {
        "objective": "regression",
        "num_leaves": trial.suggest_int("num_leaves", 8, 2048, log=True),
        "max_bin": trial.suggest_int("max_bin", 15, 4095, log=True),
        "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
        "num_threads": 1,
        "verbose": -1,
    }
    X, y = make_data(rows, SEED + trial.number)
    X_valid, y_valid = make_data(2_000, SEED + 10_000)
    booster = lgb.train(params, lgb.Dataset(X, y), num_boost_round=10)
    return float(np.mean((booster.predict(X_valid) - y_valid) ** 2))


if __name__ == "__main__":
    study = optuna.create_study(
        storage=os.environ.get("OPTUNA_STORAGE"),
        study_name=os.environ.get("STUDY_NAME"),
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=SEED),
    )
    study.optimize(objective, n_trials=N_TRIALS, n_jobs=N_JOBS)
    print("best", study.best_params)
