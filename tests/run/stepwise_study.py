"""A search in steps, as optuna-integration's LightGBMTuner runs one: ``python stepwise_study.py URL``. The
study is made with ``create_study``; each step is a ``Study`` the script makes itself on the same storage
and name, with a sampler of its own (a GridSampler over the step's one param: the others keep their
values), and runs its objective on it. It prints the trials' numbers, states and params, one line each."""

import sys

import numpy as np
import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(study_name="steps", storage=sys.argv[1])
best = {"rows": 8, "cols": 1}


def objective(trial: optuna.Trial) -> float:
    step = trial.study.user_attrs["step"]
    values = {**best, step: trial.suggest_int(step, 1, 64)}
    return float(np.ones((values["rows"] * values["cols"], 2**17)).sum())  # rows x cols MiB


for step, values in (("rows", [1, 16, 48]), ("cols", [2, 3]), ("rows", [2, 32])):
    study.set_user_attr("step", step)
    stepped = optuna.Study(study_name="steps", storage=study._storage, sampler=optuna.samplers.RandomSampler())
    stepped.sampler = optuna.samplers.GridSampler({step: values}, seed=0)  # as the tuner sets each step's sampler
    stepped.optimize(objective, n_trials=len(values))
for t in study.trials:
    print(t.number, t.state.name, t.params)
