"""PyTorch Lightning tuned with Optuna and optuna-integration's pruning callback: an MLP on synthetic data
(width, layers, batch size, learning rate), three epochs of one batch each, ``MedianPruner`` on the
validation loss.

Settings from the environment: N_TRIALS, N_JOBS, SEED, OPTUNA_STORAGE (in memory when unset), STUDY_NAME.
"""

import os

import lightning as L
import optuna
import torch
from optuna_integration import PyTorchLightningPruningCallback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N_TRIALS = int(os.environ.get("N_TRIALS", "20"))
N_JOBS = int(os.environ.get("N_JOBS", "1"))
SEED = int(os.environ.get("SEED", "0"))
FEATURES = 64


class Net(L.LightningModule):
    def __init__(self, width, layers, lr):
        super().__init__()
        blocks, inputs = [], FEATURES
        for _ in range(layers):
            blocks += [nn.Linear(inputs, width), nn.ReLU()]
            inputs = width
        self.net = nn.Sequential(*blocks, nn.Linear(inputs, 1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def data(rows, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, FEATURES, generator=g)
    return TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True))


def objective(trial):
    width = trial.suggest_int("width", 32, 8192, log=True)
    layers = trial.suggest_int("layers", 1, 6)
    batch_size = trial.suggest_int("batch_size", 8, 128, log=True)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    trainer = L.Trainer(
        max_epochs=3,
        limit_train_batches=1,
        limit_val_batches=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PyTorchLightningPruningCallback(trial, monitor="val_loss")],
    )
    trainer.fit(
        Net(width, layers, lr),
        DataLoader(data(512, SEED), batch_size=batch_size, shuffle=True),
        DataLoader(data(128, SEED + 1), batch_size=128),
    )
    return trainer.callback_metrics["val_loss"].item()


if __name__ == "__main__":
    study = optuna.create_study(
        storage=os.environ.get("OPTUNA_STORAGE"),
        study_name=os.environ.get("STUDY_NAME"),
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=SEED),
        pruner=optuna.pruners.MedianPruner(),
    )
    study.optimize(objective, n_trials=N_TRIALS, n_jobs=N_JOBS)
    print("best", study.best_params)
