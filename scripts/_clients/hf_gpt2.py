"""A Hugging Face ``Trainer.hyperparameter_search`` (optuna backend) on small GPT-2s built from config (no
download): width 64-1024, 1-8 layers, batch size 8-128 and a learning rate, three steps a trial, on a tiny
synthetic token dataset; no main guard, as most scripts have none.

Settings from the environment: N_TRIALS, N_JOBS, SEED, OPTUNA_STORAGE (in memory when unset), STUDY_NAME.
"""

import os
import tempfile

import optuna
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging

N_TRIALS = int(os.environ.get("N_TRIALS", "20"))
N_JOBS = int(os.environ.get("N_JOBS", "1"))
SEED = int(os.environ.get("SEED", "0"))
VOCAB, SEQ = 512, 8
logging.set_verbosity_error()

tokens = torch.randint(0, VOCAB, (544, SEQ), generator=torch.Generator().manual_seed(SEED))
train = [{"input_ids": t, "labels": t} for t in tokens[:512]]
valid = [{"input_ids": t, "labels": t} for t in tokens[512:]]


def model_init(trial):
    width = trial.suggest_int("n_embd", 64, 1024, step=64) if trial is not None else 64
    layers = trial.suggest_int("n_layer", 1, 8) if trial is not None else 1
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=width, n_layer=layers, n_head=4))


def hp_space(trial):
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-3, log=True),
        "per_device_train_batch_size": trial.suggest_int("per_device_train_batch_size", 8, 128, log=True),
    }


args = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="hf-search-"),
    max_steps=3,
    per_device_eval_batch_size=32,
    eval_strategy="no",
    save_strategy="no",
    logging_strategy="no",
    report_to="none",
    disable_tqdm=True,
    use_cpu=True,
    seed=SEED,
)
trainer = Trainer(model_init=model_init, args=args, train_dataset=train, eval_dataset=valid)
search = {"sampler": optuna.samplers.TPESampler(seed=SEED), "n_jobs": N_JOBS}
if os.environ.get("OPTUNA_STORAGE"):
    search.update(storage=os.environ["OPTUNA_STORAGE"], study_name=os.environ.get("STUDY_NAME"), load_if_exists=True)
best = trainer.hyperparameter_search(
    direction="minimize", backend="optuna", hp_space=hp_space, n_trials=N_TRIALS, **search
)
print("best", best)
