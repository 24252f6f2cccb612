"""A guarded Optuna study of real torch training under a small memory budget (the README's main job).

A small agent-like learner: an MLP classifies stacked 32x32 uint8 frames it samples from a replay buffer
(a numpy array, as in DQN), on 2 CPU threads. The search space has params that cannot fit a 768 MiB budget:
replay buffers of up to 8 GB (``buffer_size`` x ``frame_stack`` frames), wide first layers over stacked
frames (weights, gradients and Adam state), big batches. The guard predicts each trial's footprint with
the project's estimators, lowers the buffer or the batch when that is enough (clamped), ends the trial
before it runs when it is not (rejected), and watches the process while the trial trains: over the soft
line the pruner prunes, over the budget the trial is stopped. The median pruner prunes slow learners.

Run: ``python studies/demo.py [--trials 30] [--budget 768MiB]``; the study is stored in ``studies/demo.db``
(recreated on each run). It prints one line per trial and a summary of what was admitted, clamped,
rejected, stopped and pruned.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import array, process, torch_training  # noqa: E402
from optuna_memprune.guard import Decision, MemoryGuard, TrialRecord, read_record  # noqa: E402

THREADS = 2
FRAME = (32, 32)          # one uint8 frame; frame_stack of them make an observation
CLASSES = 10
VALIDATION = 1024
EPOCHS = 4
SECONDS_PER_EPOCH = 0.6
STEPS_PER_EPOCH = 40
STACK = ("torch", "optuna", "sqlalchemy")  # what this process imports, as `memprune calibrate` measures it


def obs_size(frame_stack: int) -> int:
    return frame_stack * FRAME[0] * FRAME[1]


def make_model(frame_stack: int, width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(obs_size(frame_stack), width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def footprint(params: dict) -> omp.Footprint:
    """The trial's peak: one Adam step of the MLP on uint8 batches, the replay buffer, the process."""
    fs, width, depth, batch = params["frame_stack"], params["width"], params["depth"], params["batch_size"]
    return (
        torch_training(lambda: make_model(fs, width, depth), (obs_size(fs),), batch_size=batch,
                       input_dtype="uint8", optimizer="adam", cache_key=("demo-mlp", fs, width, depth))
        + array((params["buffer_size"], obs_size(fs)), "uint8", name="replay buffer")
        + array((params["buffer_size"],), "int64", name="labels")
        + array((VALIDATION, obs_size(fs)), "float32", name="validation set")
        + process(STACK, torch_threads=THREADS, extra_threads=1)  # + the guard's monitor thread
    )


# What the estimators do not see (the storage's caches, numpy temporaries while the buffer fills) is not a
# fixed margin here: MemoryGuard(learn=True) learns the ratio of the observed peaks to these figures from
# the study's own trials and predicts with its upper bound (before its warm-up: the function's figures plus
# a quantile of its own misses so far, wide while few trials are known), so clamping aims under the soft line
# by that bound.


# The task: which of 10 patterns the newest frame shows (under noise); older frames are other samples.
PATTERNS = np.random.default_rng(0).integers(0, 256, (CLASSES, FRAME[0] * FRAME[1]), dtype=np.uint8)
NOISE = 192


def _fill(rng: np.random.Generator, frames: np.ndarray, labels: np.ndarray) -> None:
    """Write observations (uint8, stacked frames) and their labels in place, 4096 rows at a time."""
    pixels = FRAME[0] * FRAME[1]
    for start in range(0, len(frames), 4096):
        rows = frames[start:start + 4096]
        classes = rng.integers(0, CLASSES, (len(rows), rows.shape[1] // pixels))
        noise = rng.integers(0, NOISE, rows.shape, dtype=np.uint8)
        rows[:] = PATTERNS[classes].reshape(rows.shape) // 2 + noise
        labels[start:start + 4096] = classes[:, -1]


def objective(trial: optuna.Trial) -> float:
    frame_stack = trial.suggest_categorical("frame_stack", [1, 2, 4, 8])
    width = trial.suggest_int("width", 32, 8192, log=True)
    depth = trial.suggest_int("depth", 1, 3)
    batch_size = trial.suggest_categorical("batch_size", [32, 128, 512, 2048])
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    buffer_size = trial.suggest_int("buffer_size", 10_000, 1_000_000, log=True)

    rng = np.random.default_rng(trial.number)
    size = obs_size(frame_stack)
    buffer = np.empty((buffer_size, size), dtype=np.uint8)  # the replay buffer, filled for real
    labels = np.empty(buffer_size, dtype=np.int64)
    _fill(rng, buffer, labels)
    valid, valid_labels = np.empty((VALIDATION, size), dtype=np.uint8), np.empty(VALIDATION, dtype=np.int64)
    _fill(rng, valid, valid_labels)
    x_val, y_val = torch.from_numpy(valid).float().div_(255), torch.from_numpy(valid_labels)

    model = make_model(frame_stack, width, depth)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    accuracy = 0.0
    for epoch in range(EPOCHS):
        deadline = time.perf_counter() + SECONDS_PER_EPOCH
        for _ in range(STEPS_PER_EPOCH):
            index = rng.integers(0, buffer_size, batch_size)
            x = torch.from_numpy(buffer[index]).float().div_(255)  # as SB3 does with uint8 observations
            loss = loss_fn(model(x), torch.from_numpy(labels[index]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if time.perf_counter() > deadline:
                break
        with torch.no_grad():
            accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return accuracy


def _line(trial: optuna.trial.FrozenTrial) -> str:
    record = read_record(trial.user_attrs)
    p = trial.params
    params = (f"stack={p.get('frame_stack', '-')} width={p.get('width', '-'):>4} depth={p.get('depth', '-')} "
              f"batch={p.get('batch_size', '-'):>4} buffer={p.get('buffer_size', '-'):>7}")
    mib = lambda v: f"{v / 2**20:5.0f}" if v is not None else "    -"  # noqa: E731
    value = f"{trial.value:.3f}" if trial.value is not None else "  -  "
    decision = record.decision.value if record else "-"
    if record and record.clamped_from and record.decision is not Decision.CLAMPED:
        decision += "*"  # clamped before launch, then stopped or pruned
    moved = " ".join(f"{k}<-{v}" for k, v in record.clamped_from.items()) if record else ""
    return (f"#{trial.number:<3} {trial.state.name:8} {decision:12} {params}  pred {mib(record.pred_ram)} "
            f"peak {mib(record.peak_ram)} MiB  acc {value}  {moved}")


def _launched_as(record: TrialRecord) -> str:
    """What the guard did at launch. A trial's end (soft-pruned, stopped) replaces its launch reason, so a
    trial that ran unchecked (the first: the space is not known before it) is told apart by its prediction:
    none, or over the soft line, where an admitted trial's is under it."""
    if record.decision is Decision.REJECTED:
        return "rejected"
    if record.clamped_from:
        return "clamped"
    line = record.soft * record.budget_ram
    if "not known before launch" in record.reason or record.pred_ram is None or record.pred_ram > line:
        return "unchecked"
    return "admitted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--budget", default="768MiB")
    parser.add_argument("--storage", default=f"sqlite:///{ROOT / 'studies' / 'demo.db'}")
    args = parser.parse_args()
    start = time.perf_counter()
    torch.set_num_threads(THREADS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The guard's warnings on stderr: among them the calibration recheck's line when the cached baseline drifted.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    budget = omp.Budget(ram=args.budget, threads=16)
    guard = MemoryGuard(footprint, budget, on_infeasible="clamp", clamp=["buffer_size", "batch_size"], learn=True)
    try:
        optuna.delete_study(study_name="demo", storage=args.storage)
    except KeyError:
        pass
    study = optuna.create_study(
        study_name="demo", storage=args.storage, direction="maximize",
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=0, n_startup_trials=8)),
        pruner=guard.wrap_pruner(optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)),
    )
    print(f"{budget}; footprint = torch_training(MLP) + array(replay buffer) + process{STACK}, corrected by "
          "the learned ratio; "
          f"{args.trials} trials; pred/peak in MiB; * = clamped, then stopped or pruned")
    study.optimize(guard.wrap_objective(objective), n_trials=args.trials,
                   callbacks=[lambda s, t: print(_line(t), flush=True)])

    ends: Counter[str] = Counter()
    launch: Counter[str] = Counter()
    for trial in study.trials:
        record = read_record(trial.user_attrs)
        ends[f"{trial.state.name} {record.decision.value}"] += 1
        launch[_launched_as(record)] += 1
    print("\nat launch: " + ", ".join(f"{k} {v}" for k, v in sorted(launch.items())))
    print("at the end: " + ", ".join(f"{k} {v}" for k, v in sorted(ends.items()))
          + "  (PRUNED admitted/clamped = the median pruner)")
    rejected = next((t for t in study.trials if read_record(t.user_attrs).decision is Decision.REJECTED), None)
    if rejected is not None:
        print(f"why #{rejected.number} was rejected: {read_record(rejected.user_attrs).reason}")
    best = study.best_trial
    print(f"best: #{best.number} accuracy {best.value:.3f} {best.params}")
    print(f"stored in {args.storage}; wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
