"""SB3 DQN (CnnPolicy) on ALE/Pong-v5 with frame stack 4, tuned over rl-zoo3's DQN search space, 6 GiB per trial.

The search space is rl-zoo3's ``sample_dqn_params`` (v2.5) plus ``optimize_memory_usage``: replay buffers of
1e4 to 1e6 Atari transitions, i.e. 0.56 to 56 GB (28 GB with ``optimize_memory_usage``). A trial of the
field trains for rl-zoo3's Atari budget of 1e7 steps, so its buffer fills: the guard decides on that
(``recipes.sb3`` with ``total_timesteps=1e7``), clamps ``buffer_size`` down to the largest size that fits 6
GiB, and rejects what it may not lower (the enqueued SB3 defaults and rl-zoo3's tuned Atari config, which
need 56 GB and 5.7 GB). Each trial here then trains for real, for a few hundred to a thousand steps (SB3
allocates its buffer lazily, so only the transitions added are resident); prediction errors are taken
against the footprint of the steps that really ran (the same recipe with that ``total_timesteps``).

Run: ``python studies/sb3_dqn_atari.py [--smoke] [--trials N] [--storage URL] [--seed S]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import ale_py  # noqa: E402
import gymnasium as gym  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from optuna.distributions import CategoricalDistribution as Cat, FloatDistribution as Float  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from stable_baselines3.common.vec_env import VecFrameStack  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import recipes  # noqa: E402
from optuna_memprune.estimate.recipes.sb3 import sb3_imports  # noqa: E402

gym.register_envs(ale_py)

ENV_ID = "ALE/Pong-v5"
FRAME_STACK = 4
THREADS = 2
FIELD_TIMESTEPS = 10_000_000  # rl-zoo3 hyperparams/dqn.yml, atari: n_timesteps 1e7 (a buffer of 1e6 fills)
NET_ARCH = {"tiny": [64], "small": [64, 64], "medium": [256, 256]}  # rl-zoo3's names
# rl-zoo3 v2.5 hyperparams_opt.py sample_dqn_params, in its order, plus optimize_memory_usage.
SPACE = {
    "gamma": Cat([0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999]),
    "learning_rate": Float(1e-5, 1.0, log=True),
    "batch_size": Cat([16, 32, 64, 100, 128, 256, 512]),
    "buffer_size": Cat([10_000, 50_000, 100_000, 1_000_000]),
    "exploration_final_eps": Float(0.0, 0.2),
    "exploration_fraction": Float(0.0, 0.5),
    "target_update_interval": Cat([1, 1000, 5000, 10000, 15000, 20000]),
    "learning_starts": Cat([0, 1000, 5000, 10000, 20000]),
    "train_freq": Cat([1, 4, 8, 16, 128, 256, 1000]),
    "subsample_steps": Cat([1, 2, 4, 8]),
    "net_arch": Cat(["tiny", "small", "medium"]),
    "optimize_memory_usage": Cat([False, True]),
}
# What people start from: SB3's DQN defaults, and rl-zoo3's tuned Atari config (hyperparams/dqn.yml), as far
# as the space holds their values. Enqueued values are the user's: the guard may not lower them.
ENQUEUE = [
    {"buffer_size": 1_000_000, "batch_size": 32, "learning_rate": 1e-4, "gamma": 0.99, "train_freq": 4,
     "subsample_steps": 4, "target_update_interval": 10000, "exploration_fraction": 0.1,
     "exploration_final_eps": 0.05, "optimize_memory_usage": False},
    {"buffer_size": 100_000, "batch_size": 32, "learning_rate": 1e-4, "target_update_interval": 1000,
     "train_freq": 4, "subsample_steps": 4, "exploration_fraction": 0.1, "exploration_final_eps": 0.01,
     "optimize_memory_usage": False},
]
# The shortened run of each trial: env steps, and gradient updates (a 512-batch update takes ~0.5 s here).
RUN = {"full": {"steps": 1000, "updates": 24, "report_every": 250},
       "smoke": {"steps": 400, "updates": 4, "report_every": 200}}
STEPS_ATTR = "steps_run"  # user attr: env steps the trial really ran (its buffer holds that many)


def sb3_params(p: dict) -> dict:
    """rl-zoo3's params -> DQN's keyword arguments (as the zoo converts them)."""
    return {
        "gamma": p["gamma"], "learning_rate": p["learning_rate"], "batch_size": p["batch_size"],
        "buffer_size": p["buffer_size"], "exploration_final_eps": p["exploration_final_eps"],
        "exploration_fraction": p["exploration_fraction"], "target_update_interval": p["target_update_interval"],
        "learning_starts": p["learning_starts"], "train_freq": p["train_freq"],
        "gradient_steps": max(p["train_freq"] // p["subsample_steps"], 1),
        "optimize_memory_usage": p["optimize_memory_usage"],
    }


def footprint(params: dict, total_timesteps: int = FIELD_TIMESTEPS) -> omp.Footprint:
    """The trial's peak after ``total_timesteps`` steps (default: the field's run, buffer full)."""
    p = dict(sb3_params(params), net_arch=params["net_arch"], torch_threads=THREADS, total_timesteps=total_timesteps)
    return (recipes.sb3("dqn", ENV_ID, p, frame_stack=FRAME_STACK)
            + _common.study_extras(sb3_imports(atari=True), torch_threads=THREADS))


def as_ran(trial: optuna.trial.FrozenTrial) -> omp.Footprint:
    """The footprint of the steps the trial really ran (its buffer holds that many transitions)."""
    return footprint(trial.params, max(1, trial.user_attrs.get(STEPS_ATTR, 1)))


def _stop_updates(run: dict):
    """At the run's cap of gradient updates, DQN stops training but the env keeps stepping (the buffer
    fills as planned)."""
    def on_step(model) -> None:
        if model._n_updates >= run["updates"]:
            model.gradient_steps = 0
    return on_step


def make_objective(run: dict, seed: int):
    @_common.released
    def objective(trial: optuna.Trial) -> float:
        params = _common.suggest(trial, SPACE)
        kwargs = sb3_params(params)
        kwargs["learning_starts"] = min(kwargs["learning_starts"], run["steps"] // 2)  # shortened run
        kwargs["gradient_steps"] = min(kwargs["gradient_steps"], run["updates"])
        if kwargs["optimize_memory_usage"]:
            kwargs["replay_buffer_kwargs"] = {"handle_timeout_termination": False}
        env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=seed + trial.number), FRAME_STACK)
        callback = _common.RewardRate(trial, run["report_every"], on_step=_stop_updates(run))
        try:
            model = DQN("CnnPolicy", env, policy_kwargs={"net_arch": NET_ARCH[params["net_arch"]]},
                        device="cpu", seed=seed + trial.number, verbose=0, **kwargs)
            model.learn(run["steps"], callback=callback)
            return callback.value
        finally:
            trial.set_user_attr(STEPS_ATTR, callback.steps)
            env.close()

    return objective


def main() -> None:
    args = _common.arguments(__doc__, trials=16, smoke_trials=4)
    torch.set_num_threads(THREADS)
    run = RUN["smoke" if args.smoke else "full"]
    study = _common.Study(
        name="sb3_dqn_atari", space=SPACE, objective=make_objective(run, args.seed), footprint=footprint,
        budget=omp.Budget(ram="6GiB", threads=16), clamp=["buffer_size"], enqueue=ENQUEUE, as_ran=as_ran,
        show=("buffer_size", "optimize_memory_usage", "batch_size", "net_arch", "train_freq"),
        headline=f"footprint = recipes.sb3('dqn', {ENV_ID!r}, frame_stack={FRAME_STACK}) after "
                 f"{FIELD_TIMESTEPS:.0e} steps + study imports; each trial runs {run['steps']} steps, "
                 f"{run['updates']} updates",
    )
    _common.run(study, args)


if __name__ == "__main__":
    main()
