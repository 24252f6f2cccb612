"""The example study with its own footprint declared for ``memprune run --footprint auto``."""

import optuna

import optuna_memprune as omp
from example_study import objective


def memprune_footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=200 * 2**20 + params["buffer_size"] * 32)


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    study.optimize(objective, n_trials=3)
    print("declared done")
