"""A library that creates and runs the study for its caller, as Hugging Face's ``Trainer.hyperparameter_search``
does: the caller's script never names ``create_study``. Also the marks the scripts of these tests leave (one
line per execution of their top level, one per call of their objective) and their report of the trials."""

import json
import os

import optuna

from optuna_memprune import records


def search(objective, n_trials: int, n_jobs: int) -> optuna.Study:
    """An in-memory study made here, run with ``n_jobs`` jobs."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=n_trials, n_jobs=n_jobs)
    return study


def mark(path: str, what: str) -> None:
    """One line ``WHAT PID`` appended to ``path``."""
    with open(path, "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def report(study: optuna.Study) -> None:
    """The study's trials as one JSON line on stdout: number, state, whether the guard's record is on it."""
    print(
        json.dumps(
            [
                {"number": t.number, "state": t.state.name, "record": records.read(t.user_attrs) is not None}
                for t in study.get_trials(deepcopy=False)
            ]
        ),
        flush=True,
    )
