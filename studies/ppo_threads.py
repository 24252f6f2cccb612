"""A thread-heavy actor-critic PPO (ElegantRL-style) with rollout worker processes, budgeted in RAM and threads.

The learner holds an actor and a critic, a target copy of each (soft-updated) and an Adam optimizer on
each; ``worker_num`` rollout worker processes each hold a copy of the actor and step ``ENVS_PER_WORKER``
Pendulum-v1 envs, computing their actions in one batch; every process runs ``torch.set_num_threads(
thread_num)``. The search space is the one people tune there: ``net_dim`` 256..1536, ``worker_num`` and
``thread_num`` 4..15. Threads add up fast: torch starts about two OS threads per torch thread in every
process that runs batched matrix products, so 8 torch threads in a learner and 3 workers is over 60
threads. The budget is 30 threads and 1.5 GiB for the whole process tree; the guard may lower
``thread_num`` (clamped) and rejects what fewer torch threads cannot bring under budget (too many
workers). The footprint: the learner's calibrated baseline and threads, its traced training step, and per
worker a calibrated process (it re-imports this script, as ``spawn`` does), the actor's inference and the
weights it receives.

Run: ``python studies/ppo_threads.py [--smoke] [--trials N] [--storage URL] [--seed S]``.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from optuna.distributions import IntDistribution as Int  # noqa: E402
from torch import nn  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import array, process, torch_inference, torch_training  # noqa: E402

ENV_ID = "Pendulum-v1"
OBS_DIM, ACT_DIM = 3, 1
ENVS_PER_WORKER = 4
STACK = ("torch", "gymnasium") + _common.STUDY_IMPORTS  # what the learner imports
WORKER_STACK = ("torch", "gymnasium") + _common.SCRIPT_IMPORTS  # a spawned worker re-imports this script
SPACE = {
    "net_dim": Int(256, 1536, step=256),
    "worker_num": Int(1, 4),
    "thread_num": Int(4, 15),
}
MODES = {"full": {"rounds": 3, "horizon": 256, "batch": 256, "repeat": 2},
         "smoke": {"rounds": 1, "horizon": 64, "batch": 128, "repeat": 1}}
# Per rollout step and env: obs, action, log-prob, reward, done as float32 (the learner's rollout arrays)
# plus value and advantage, computed there.
ROLLOUT_FLOATS = OBS_DIM + ACT_DIM + 1 + 1 + 1 + 2


class Actor(nn.Module):
    """A Gaussian policy: an MLP for the mean and a state-independent log std (ElegantRL's ActorPPO)."""

    def __init__(self, net_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, net_dim), nn.ReLU(), nn.Linear(net_dim, net_dim), nn.ReLU(),
                                 nn.Linear(net_dim, ACT_DIM))
        self.log_std = nn.Parameter(torch.zeros(1, ACT_DIM))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.net(obs), self.log_std.exp())


def critic(net_dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(OBS_DIM, net_dim), nn.ReLU(), nn.Linear(net_dim, net_dim), nn.ReLU(),
                         nn.Linear(net_dim, 1))


def _weights_bytes(net_dim: int) -> int:
    with torch.device("meta"):
        return sum(p.numel() * p.element_size() for p in Actor(net_dim).parameters())


def footprint(p: dict, mode: dict) -> omp.Footprint:
    d, w, n = p["net_dim"], p["worker_num"], p["thread_num"]
    rollout = w * ENVS_PER_WORKER * mode["horizon"]
    learner = (
        process(STACK, torch_threads=n)
        + torch_training({"actor": lambda: Actor(d), "critic": lambda: critic(d)},
                         {"actor": [(OBS_DIM,)], "critic": [(OBS_DIM,)]}, batch_size=mode["batch"],
                         optimizer="adam", frozen={"actor": 1, "critic": 1}, cache_key=("ppo_threads", d),
                         name="actor-critic")
        + array((rollout, ROLLOUT_FLOATS), "float32", name="rollout arrays")
        + omp.Footprint.of(ram=_weights_bytes(d), name="actor weights pickled for the workers")
        + _common.MONITOR_THREAD
    )
    worker = (
        process(WORKER_STACK, torch_threads=n, training=False)
        + torch_inference(lambda: Actor(d), (OBS_DIM,), batch_size=ENVS_PER_WORKER,
                          cache_key=("ppo_threads-actor", d), name="worker actor")
        + omp.Footprint.of(ram=2 * _weights_bytes(d), name="weights received (pickle + arrays)")
        + array((mode["horizon"], ENVS_PER_WORKER, ROLLOUT_FLOATS - 2), "float32", name="worker rollout")
    )
    workers = omp.Footprint.of(ram=worker.ram * w, threads=worker.threads * w, processes=w,
                               name=f"rollout workers x{w}", kind=omp.Kind.WORKERS)
    return learner + workers


def rollout_worker(conn, thread_num: int, net_dim: int, horizon: int, seed: int) -> None:
    """A rollout worker process: receives actor weights, steps its envs ``horizon`` steps, sends arrays."""
    torch.set_num_threads(thread_num)
    torch.set_grad_enabled(False)
    envs = [gym.make(ENV_ID) for _ in range(ENVS_PER_WORKER)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    actor = Actor(net_dim)
    while (message := conn.recv()) is not None:
        actor.load_state_dict({k: torch.from_numpy(v) for k, v in pickle.loads(message).items()})
        out = np.zeros((horizon, ENVS_PER_WORKER, ROLLOUT_FLOATS - 2), np.float32)
        for t in range(horizon):
            dist = actor.dist(torch.from_numpy(obs))
            action = dist.sample()
            logp = dist.log_prob(action).sum(1)
            out[t, :, :OBS_DIM] = obs
            out[t, :, OBS_DIM:OBS_DIM + ACT_DIM] = action.numpy()
            out[t, :, OBS_DIM + ACT_DIM] = logp.numpy()
            for i, env in enumerate(envs):
                nxt, reward, term, trunc, _ = env.step(action[i].numpy().clip(-2.0, 2.0))
                out[t, i, OBS_DIM + ACT_DIM + 1] = reward
                out[t, i, OBS_DIM + ACT_DIM + 2] = float(term or trunc)
                obs[i] = env.reset()[0] if term or trunc else nxt
        conn.send(out)
    conn.close()


def _soft_update(target: nn.Module, net: nn.Module, tau: float = 0.01) -> None:
    with torch.no_grad():
        for t, s in zip(target.parameters(), net.parameters()):
            t.mul_(1 - tau).add_(s, alpha=tau)


def train_round(nets: dict, data: np.ndarray, mode: dict, gamma: float = 0.99, lam: float = 0.95) -> float:
    """One PPO update on a rollout of shape (workers, horizon, envs, fields); returns the mean reward."""
    actor, critic_net, actor_target, critic_target, opt_a, opt_c = (
        nets[k] for k in ("actor", "critic", "actor_target", "critic_target", "opt_actor", "opt_critic"))
    obs = torch.from_numpy(data[..., :OBS_DIM])
    act = torch.from_numpy(data[..., OBS_DIM:OBS_DIM + ACT_DIM])
    logp_old, reward, done = (torch.from_numpy(data[..., OBS_DIM + ACT_DIM + i]) for i in range(3))
    with torch.no_grad():  # GAE over each worker's horizon, values from the critic's target copy
        value = critic_target(obs).squeeze(-1)
        adv = torch.zeros_like(reward)
        last = torch.zeros_like(reward[:, 0])
        for t in reversed(range(data.shape[1])):
            nxt = value[:, t + 1] if t + 1 < data.shape[1] else value[:, t]
            delta = reward[:, t] + gamma * (1 - done[:, t]) * nxt - value[:, t]
            last = delta + gamma * lam * (1 - done[:, t]) * last
            adv[:, t] = last
        ret = adv + value
    obs, act, logp_old, adv, ret = (x.reshape(-1, *x.shape[3:]) for x in (obs, act, logp_old, adv, ret))
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    for _ in range(mode["repeat"]):
        for idx in torch.randperm(len(obs)).split(mode["batch"]):
            ratio = (actor.dist(obs[idx]).log_prob(act[idx]).sum(1) - logp_old[idx]).exp()
            loss_a = -torch.min(ratio * adv[idx], ratio.clamp(0.8, 1.2) * adv[idx]).mean()
            opt_a.zero_grad(set_to_none=True)
            loss_a.backward()
            opt_a.step()
            loss_c = (critic_net(obs[idx]).squeeze(-1) - ret[idx]).square().mean()
            opt_c.zero_grad(set_to_none=True)
            loss_c.backward()
            opt_c.step()
            _soft_update(actor_target, actor)
            _soft_update(critic_target, critic_net)
    return float(reward.mean())


def make_objective(mode: dict, seed: int):
    @_common.released
    def objective(trial: optuna.Trial) -> float:
        p = _common.suggest(trial, SPACE)
        torch.set_num_threads(p["thread_num"])
        actor, critic_net = Actor(p["net_dim"]), critic(p["net_dim"])
        nets = {"actor": actor, "critic": critic_net, "actor_target": copy.deepcopy(actor),
                "critic_target": copy.deepcopy(critic_net),
                "opt_actor": torch.optim.Adam(actor.parameters(), lr=3e-4),
                "opt_critic": torch.optim.Adam(critic_net.parameters(), lr=3e-4)}
        ctx = mp.get_context("spawn")
        pipes, procs = [], []
        try:
            for i in range(p["worker_num"]):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=rollout_worker, daemon=True, args=(
                    theirs, p["thread_num"], p["net_dim"], mode["horizon"], seed + 100 * trial.number + 10 * i))
                proc.start()
                pipes.append(mine)
                procs.append(proc)
            value = 0.0
            for r in range(mode["rounds"]):
                weights = pickle.dumps({k: v.numpy() for k, v in actor.state_dict().items()})
                for conn in pipes:
                    conn.send(weights)
                del weights
                data = np.stack([conn.recv() for conn in pipes])
                value = train_round(nets, data, mode)
                trial.report(value, r)
                if trial.should_prune():
                    raise optuna.TrialPruned()
            return value
        finally:
            for conn in pipes:
                try:
                    conn.send(None)
                except OSError:
                    pass
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()

    return objective


def main() -> None:
    args = _common.arguments(__doc__, trials=12, smoke_trials=4)
    mode = MODES["smoke" if args.smoke else "full"]
    study = _common.Study(
        name="ppo_threads", space=SPACE, objective=make_objective(mode, args.seed),
        footprint=lambda p: footprint(p, mode), budget=omp.Budget(ram="1.5GiB", threads=30),
        clamp=["thread_num"], show=tuple(SPACE), n_startup_trials=4,
        headline=f"learner + worker_num spawned workers x {ENVS_PER_WORKER} {ENV_ID} envs; "
                 f"{mode['rounds']} rounds of {mode['horizon']} steps",
    )
    _common.run(study, args)


if __name__ == "__main__":
    main()
