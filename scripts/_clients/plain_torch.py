"""A plain torch training script tuned with Optuna, as people write one: an MLP on synthetic data (width,
depth, batch size, learning rate), three optimizer steps a trial, no main guard.

Settings from the environment: N_TRIALS, N_JOBS, SEED, OPTUNA_STORAGE (in memory when unset), STUDY_NAME.
"""

import os

import optuna
import torch
from torch import nn

N_TRIALS = int(os.environ.get("N_TRIALS", "20"))
N_JOBS = int(os.environ.get("N_JOBS", "1"))
SEED = int(os.environ.get("SEED", "0"))
FEATURES = 256

torch.manual_seed(SEED)
x = torch.randn(4096, FEATURES)
y = x[:, :8].sum(dim=1, keepdim=True)


def objective(trial):
    width = trial.suggest_int("width", 64, 8192, step=64)
    depth = trial.suggest_int("depth", 1, 4)
    batch_size = trial.suggest_int("batch_size", 8, 128, log=True)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    layers, inputs = [], FEATURES
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), nn.ReLU()]
        inputs = width
    model = nn.Sequential(*layers, nn.Linear(inputs, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(3):
        rows = torch.randint(0, len(x), (batch_size,))
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return nn.functional.mse_loss(model(x[:512]), y[:512]).item()


study = optuna.create_study(
    storage=os.environ.get("OPTUNA_STORAGE"),
    study_name=os.environ.get("STUDY_NAME"),
    load_if_exists=True,
    sampler=optuna.samplers.TPESampler(seed=SEED),
)
study.optimize(objective, n_trials=N_TRIALS, n_jobs=N_JOBS)
print("best", study.best_params)
