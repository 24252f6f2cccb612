"""A LightGBM search as people write it: no main guard, no footprint, n_jobs=2, an in-memory study.

Run unchanged under ``memprune run --ram 1GiB --storage sqlite:///gbm.db -- python gbm_search.py`` by
``scripts/core_check.py`` in a venv of the core install alone (no torch, rich or matplotlib).
"""

import lightgbm as lgb
import optuna
from sklearn.datasets import make_classification
from sklearn.model_selection import cross_val_score

X, y = make_classification(n_samples=3000, n_features=40, random_state=0)


def objective(trial):
    model = lgb.LGBMClassifier(
        n_estimators=trial.suggest_int("n_estimators", 20, 150, log=True),
        num_leaves=trial.suggest_int("num_leaves", 8, 256, log=True),
        max_bin=trial.suggest_int("max_bin", 15, 511, log=True),
        learning_rate=trial.suggest_float("learning_rate", 1e-3, 0.3, log=True),
        verbose=-1,
        n_jobs=1,
    )
    return cross_val_score(model, X, y, cv=3).mean()


study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
study.optimize(objective, n_trials=10, n_jobs=2)
print(f"best {study.best_value:.4f} after {len(study.trials)} trials")
