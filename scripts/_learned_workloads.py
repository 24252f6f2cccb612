"""The three real studies of ``bench_learned.py``, none with a footprint function: module-level objectives
(the process-per-trial runner pickles them into its children) and their search spaces.

- ``keras_dqn``: a Keras (TensorFlow CPU) DQN on CartPole whose replay memory is the tutorial's
  ``collections.deque(maxlen=...)`` of ``(obs, action, reward, next_obs, done)`` tuples, filled with
  random-policy transitions, then trained for a few batches; ``maxlen``, the Q-network's width and the
  batch size are tuned.
- ``lightgbm``: LightGBM on a synthetic regression set whose rows are tuned with ``num_leaves`` and
  ``max_bin`` (the binned set grows with rows and bins, the histogram pool with leaves x bins).
- ``torch_mlp``: a torch MLP (2 to 4 layers) trained with Adam on random data; widths up to 16384 and
  batches up to 4096 cannot fit (16 bytes of weights, gradients and Adam state per weight).

TensorFlow is imported inside the objective (each trial's process imports it): a fork server that had
imported it would hand its children TensorFlow's threads' state.
"""

from __future__ import annotations

import collections
import random
import time

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution as Cat, FloatDistribution as Float
from optuna.distributions import IntDistribution as Int

SPACES = {
    "keras_dqn": {
        "maxlen": Int(1_000, 50_000, log=True),
        "width": Int(64, 16384, log=True),
        "batch_size": Cat([32, 64, 128, 256, 512]),
        "lr": Float(1e-4, 1e-2, log=True),
    },
    "lightgbm": {
        "rows": Int(5_000, 100_000, log=True),
        "num_leaves": Int(8, 4096, log=True),
        "max_bin": Int(15, 1023, log=True),
        "learning_rate": Float(0.01, 0.3, log=True),
    },
    "torch_mlp": {
        "width": Int(64, 16384, log=True),
        "depth": Int(2, 4),
        "batch_size": Cat([32, 128, 512, 2048, 4096]),
        "lr": Float(1e-4, 1e-2, log=True),
    },
}
FEATURES = 40  # LightGBM's columns
OBS, ACTIONS = 4, 2


def _suggest(trial: optuna.Trial, name: str) -> dict:
    out = {}
    for key, dist in SPACES[name].items():
        if isinstance(dist, Cat):
            out[key] = trial.suggest_categorical(key, dist.choices)
        elif isinstance(dist, Int):
            out[key] = trial.suggest_int(key, dist.low, dist.high, log=dist.log)
        else:
            out[key] = trial.suggest_float(key, dist.low, dist.high, log=dist.log)
    return out


def keras_dqn(trial: optuna.Trial) -> float:
    """Fill the deque with random CartPole transitions, then 10 DQN updates of a three-layer Q-network."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import gymnasium as gym
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    p = _suggest(trial, "keras_dqn")
    random.seed(trial.number)
    memory: collections.deque = collections.deque(maxlen=p["maxlen"])
    env = gym.make("CartPole-v1")
    state, _ = env.reset(seed=trial.number)
    for _ in range(p["maxlen"]):
        action = env.action_space.sample()
        nxt, reward, terminated, truncated, _ = env.step(action)
        memory.append((state, action, reward, nxt, terminated))
        state = nxt if not (terminated or truncated) else env.reset()[0]
    net = tf.keras.Sequential(
        [
            tf.keras.Input((OBS,)),
            *(tf.keras.layers.Dense(p["width"], activation="relu") for _ in range(3)),
            tf.keras.layers.Dense(ACTIONS),
        ]
    )
    net.compile(optimizer=tf.keras.optimizers.Adam(p["lr"]), loss="mse")
    loss = 0.0
    for _ in range(10):
        batch = random.sample(memory, p["batch_size"])
        obs = np.stack([b[0] for b in batch]).astype(np.float32)
        nxt = np.stack([b[3] for b in batch]).astype(np.float32)
        target = net.predict_on_batch(obs)
        best = net.predict_on_batch(nxt).max(1)
        for i, (_, a, r, _, done) in enumerate(batch):
            target[i, a] = r + (0.0 if done else 0.99 * best[i])
        loss = float(net.train_on_batch(obs, target))
    env.close()
    return loss


def lightgbm(trial: optuna.Trial) -> float:
    """Train 5 boosting rounds on ``rows`` x 40 synthetic features; the training L2 loss on 2000 rows."""
    import lightgbm as lgb

    p = _suggest(trial, "lightgbm")
    rng = np.random.default_rng(trial.number)
    x = rng.standard_normal((p["rows"], FEATURES)).astype(np.float32)
    y = x[:, :5].sum(1) + np.sin(x[:, 5] * 3) + 0.1 * rng.standard_normal(p["rows"])
    data = lgb.Dataset(x, y, params={"max_bin": p["max_bin"], "verbose": -1})
    booster = lgb.train(
        {
            "objective": "regression",
            "num_leaves": p["num_leaves"],
            "max_bin": p["max_bin"],
            "learning_rate": p["learning_rate"],
            "min_data_in_leaf": 5,
            "num_threads": 1,
            "verbose": -1,
        },
        data,
        num_boost_round=5,
    )
    return float(np.mean((booster.predict(x[:2000]) - y[:2000]) ** 2))


def torch_mlp(trial: optuna.Trial) -> float:
    """Five Adam steps of a ``depth``-layer MLP of ``width`` on random batches (at most about 3 s)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    p = _suggest(trial, "torch_mlp")
    torch.manual_seed(trial.number)
    layers: list[nn.Module] = [nn.Linear(64, p["width"]), nn.ReLU()]
    for _ in range(p["depth"] - 1):
        layers += [nn.Linear(p["width"], p["width"]), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(p["width"], 10))
    opt = torch.optim.Adam(net.parameters(), lr=p["lr"])
    loss = torch.zeros(())
    start = time.monotonic()
    for _ in range(5):
        x, y = torch.randn(p["batch_size"], 64), torch.randint(0, 10, (p["batch_size"],))
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if time.monotonic() - start > 3:  # a huge trial that fits: cut its training, keep its peak
            break
    return float(loss.detach())


OBJECTIVES = {"keras_dqn": keras_dqn, "lightgbm": lightgbm, "torch_mlp": torch_mlp}


def plain_trial(conn, name: str, params: dict, number: int, join) -> None:
    """One trial of the plain (unguarded) study in its own process: join its cgroup (the hard limit), run
    the objective on the params the parent sampled, send back ``("complete", value)`` or ``("fail", text)``
    (``"oom"`` for a ``MemoryError``); killed by the kernel at the limit, it sends nothing."""
    from optuna_memprune import cgroups

    if join is not None:
        cgroups.join(join)
    try:
        conn.send(("complete", OBJECTIVES[name](optuna.trial.FixedTrial(params, number))))
    except MemoryError:
        conn.send(("oom", "MemoryError"))
    except Exception as exc:  # noqa: BLE001 - the plain study records it as a failed trial
        conn.send(("fail", f"{type(exc).__name__}: {exc}"))
