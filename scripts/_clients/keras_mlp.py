"""A Keras (TensorFlow) regression model tuned with Optuna: widths, layers, batch size and a learning rate,
one epoch of three batches a trial.

Settings from the environment: N_TRIALS, N_JOBS, SEED, OPTUNA_STORAGE (in memory when unset), STUDY_NAME.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402

N_TRIALS = int(os.environ.get("N_TRIALS", "20"))
N_JOBS = int(os.environ.get("N_JOBS", "1"))
SEED = int(os.environ.get("SEED", "0"))

rng = np.random.default_rng(SEED)
x = rng.standard_normal((768, 64)).astype("float32")
y = x[:, :4].sum(axis=1, keepdims=True)


def objective(trial):
    width = trial.suggest_int("width", 64, 8192, step=64)
    layers = trial.suggest_int("layers", 1, 4)
    batch_size = trial.suggest_int("batch_size", 16, 256, log=True)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    model = keras.Sequential(
        [keras.Input((64,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(layers)]
        + [keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=lr), loss="mse")
    history = model.fit(x[: 3 * batch_size], y[: 3 * batch_size], batch_size=batch_size, epochs=1, verbose=0)
    return float(history.history["loss"][-1])


if __name__ == "__main__":
    study = optuna.create_study(
        storage=os.environ.get("OPTUNA_STORAGE"),
        study_name=os.environ.get("STUDY_NAME"),
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=SEED),
    )
    study.optimize(objective, n_trials=N_TRIALS, n_jobs=N_JOBS)
    print("best", study.best_params)
