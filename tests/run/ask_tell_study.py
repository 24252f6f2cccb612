"""A program that makes some trials with an ask-and-tell loop (study.ask() and study.tell(), outside
study.optimize) and the rest with study.optimize."""

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
for _ in range(3):
    trial = study.ask()
    study.tell(trial, float(trial.suggest_int("x", 0, 9)))
study.optimize(lambda t: float(t.suggest_int("x", 0, 9)), n_trials=2)
print(len(study.trials), "trials")
