"""A tutorial-style DQN on CartPole whose replay memory is a ``collections.deque`` of tuples, against a numpy ring.

The pattern of countless tutorials: ``memory = deque(maxlen=buffer_size)`` of ``(obs, action, reward,
next_obs, done)`` tuples, ``random.sample(memory, batch_size)``, ``state = next_state``. For CartPole a
transition holds 16 bytes of observation, but as Python objects it costs about 270 bytes: the tuple, the
ndarray object and its two small heap blocks, a numpy int64 action (what ``action_space.sample()``
returns), the deque's blocks; the reward (CartPole's constant ``1.0``) and ``next_obs`` (the next
transition's ``obs``) are shared. The same transitions in a numpy ring buffer (``buffer_kind="numpy"``)
take 45 bytes. ``deque_buffer`` prices each object as CPython and glibc allocate it; ``array`` prices the
ring. The budget, 600 MiB for the process, admits a million transitions as a ring and rejects them as a
deque (``on_infeasible="reject"``). Each trial fills its buffer with random-policy transitions (the warm-up
phase), then trains with epsilon-greedy acting, one update per env step.

Run: ``python studies/dqn_deque.py [--smoke] [--trials N] [--storage URL] [--seed S]``.
"""

from __future__ import annotations

import collections
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from optuna.distributions import CategoricalDistribution as Cat, FloatDistribution as Float  # noqa: E402
from torch import nn  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import array, deque_buffer, process, torch_training  # noqa: E402

ENV_ID = "CartPole-v1"
OBS_DIM, N_ACTIONS = 4, 2
THREADS = 1
STACK = ("torch", "gymnasium") + _common.STUDY_IMPORTS
SPACE = {
    "buffer_kind": Cat(["deque", "numpy"]),
    "buffer_size": Cat([10_000, 100_000, 300_000, 1_000_000]),
    "batch_size": Cat([32, 64, 128, 256]),
    "hidden": Cat([64, 128, 256]),
    "lr": Float(1e-4, 1e-2, log=True),
}
# The contrast that makes the point: a million transitions as a deque and as a ring, and a deque that fits.
ENQUEUE = [{"buffer_kind": "deque", "buffer_size": 1_000_000}, {"buffer_kind": "numpy", "buffer_size": 1_000_000},
           {"buffer_kind": "deque", "buffer_size": 300_000}]
MODES = {"full": {"train_steps": 600, "report_every": 200}, "smoke": {"train_steps": 100, "report_every": 50}}
# One transition as the tutorial loop stores it (see deque_buffer): obs owns its 4 float32; the action is a
# numpy int64; the reward is CartPole's shared constant 1.0 and next_obs is the next tuple's obs (both
# references); done is a shared bool.
TRANSITION = [((OBS_DIM,), "float32"), np.int64, None, None, bool]
# The ring's arrays: (name, per-transition shape, dtype); the same table allocates and prices them.
RING = (("obs", (OBS_DIM,), "float32"), ("next_obs", (OBS_DIM,), "float32"), ("action", (), "int64"),
        ("reward", (), "float32"), ("done", (), "bool"))


def qnet(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, N_ACTIONS))


def footprint(p: dict) -> omp.Footprint:
    n = p["buffer_size"]
    if p["buffer_kind"] == "deque":
        buffer = deque_buffer(TRANSITION, maxlen=n, name="deque of tuples")
    else:
        buffer = sum((array((n, *shape), dtype, name=f"ring {name}") for name, shape, dtype in RING), omp.Footprint())
    return (process(STACK, torch_threads=THREADS) + buffer
            + torch_training(lambda: qnet(p["hidden"]), (OBS_DIM,), batch_size=p["batch_size"], optimizer="adam",
                             frozen=1, cache_key=("dqn_deque", p["hidden"]), name="q-net")
            + _common.MONITOR_THREAD)


class DequeMemory:
    """The tutorial's replay memory."""

    def __init__(self, size: int) -> None:
        self.memory: collections.deque = collections.deque(maxlen=size)

    def push(self, obs, action, reward, next_obs, done) -> None:
        self.memory.append((obs, action, reward, next_obs, done))

    def sample(self, batch: int) -> tuple[np.ndarray, ...]:
        obs, action, reward, next_obs, done = zip(*random.sample(self.memory, batch))
        return np.stack(obs), np.array(action), np.array(reward, np.float32), np.stack(next_obs), np.array(done)


class RingMemory:
    """The same transitions in preallocated numpy arrays (the layout of ``RING``)."""

    def __init__(self, size: int) -> None:
        self.arrays = {name: np.zeros((size, *shape), dtype) for name, shape, dtype in RING}
        self.size, self.pos, self.full = size, 0, False

    def push(self, obs, action, reward, next_obs, done) -> None:
        for name, value in zip(self.arrays, (obs, next_obs, action, reward, done)):
            self.arrays[name][self.pos] = value
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch: int) -> tuple[np.ndarray, ...]:
        idx = np.random.randint(0, self.size if self.full else self.pos, batch)
        a = self.arrays
        return a["obs"][idx], a["action"][idx], a["reward"][idx], a["next_obs"][idx], a["done"][idx]


def make_objective(mode: dict, seed: int):
    @_common.released
    def objective(trial: optuna.Trial) -> float:
        p = _common.suggest(trial, SPACE)
        random.seed(seed + trial.number)
        np.random.seed(seed + trial.number)
        memory = (DequeMemory if p["buffer_kind"] == "deque" else RingMemory)(p["buffer_size"])
        env = gym.make(ENV_ID)
        env.action_space.seed(seed + trial.number)
        state, _ = env.reset(seed=seed + trial.number)
        for _ in range(p["buffer_size"]):  # warm-up: random actions until the memory is full
            action = env.action_space.sample()
            next_state, reward, terminated, truncated, _ = env.step(action)
            memory.push(state, action, reward, next_state, terminated)
            state = next_state if not (terminated or truncated) else env.reset()[0]
        net, target = qnet(p["hidden"]), qnet(p["hidden"])
        target.load_state_dict(net.state_dict())
        opt = torch.optim.Adam(net.parameters(), lr=p["lr"])
        returns, episode = [], 0.0
        for step in range(1, mode["train_steps"] + 1):
            if random.random() < 0.1:
                action = env.action_space.sample()
            else:
                with torch.no_grad():
                    action = int(net(torch.from_numpy(state)).argmax())
            next_state, reward, terminated, truncated, _ = env.step(action)
            memory.push(state, action, reward, next_state, terminated)
            episode += reward
            if terminated or truncated:
                returns.append(episode)
                episode, state = 0.0, env.reset()[0]
            else:
                state = next_state
            obs, act, rew, nxt, done = (torch.as_tensor(x) for x in memory.sample(p["batch_size"]))
            with torch.no_grad():
                y = rew + 0.99 * (1 - done.float()) * target(nxt).max(1).values
            q = net(obs).gather(1, act.long()[:, None])[:, 0]
            loss = nn.functional.mse_loss(q, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 100 == 0:
                target.load_state_dict(net.state_dict())
            if step % mode["report_every"] == 0:
                trial.report(float(np.mean(returns or [episode])), step)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        env.close()
        return float(np.mean(returns or [episode]))

    return objective


def main() -> None:
    args = _common.arguments(__doc__, trials=12, smoke_trials=4)
    torch.set_num_threads(THREADS)
    mode = MODES["smoke" if args.smoke else "full"]
    study = _common.Study(
        name="dqn_deque", space=SPACE, objective=make_objective(mode, args.seed), footprint=footprint,
        budget=omp.Budget(ram="600MiB", threads=16), policy="reject", enqueue=ENQUEUE, show=tuple(SPACE)[:4],
        n_startup_trials=4,
        headline="footprint = process + deque_buffer(tuples) or array(ring) + torch_training(q-net); "
                 f"{mode['train_steps']} training steps after the warm-up fill",
    )
    _common.run(study, args)


if __name__ == "__main__":
    main()
