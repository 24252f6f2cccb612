"""SB3 PPO (CnnPolicy) on Pong's pixels with SubprocVecEnv workers, budgeted per process tree.

A field script's knobs: NUM_ENVS worker processes, EP_LENGTH steps per env per rollout (``n_steps``),
FRAME_STACK, BATCH_SIZE and N_EPOCHS. Memory grows with all of them at once: every worker is a process
(each re-imports this script, as multiprocessing does), the rollout buffer holds NUM_ENVS x EP_LENGTH
stacked uint8 frames, and ``get()`` copies it before the minibatches are copied again. The budget covers
the whole process tree (trial process, workers, multiprocessing helpers); the footprint is
``recipes.sb3("ppo", ..., vec_env="subproc")`` plus what this script's imports add to the trial process and
to each worker. Each trial collects one full rollout and trains on it (the first minibatches of each epoch,
to keep trials short; ``get()`` copies the whole rollout as usual).

Run: ``python studies/ppo_pixels.py [--smoke] [--trials N] [--storage URL] [--seed S]``.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import ale_py  # noqa: E402
import gymnasium as gym  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from optuna.distributions import CategoricalDistribution as Cat  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import process, recipes  # noqa: E402
from optuna_memprune.estimate.recipes.sb3 import sb3_imports  # noqa: E402

gym.register_envs(ale_py)  # at import: every SubprocVecEnv worker re-imports this script

ENV_ID = "ALE/Pong-v5"
THREADS = 2
SPACE = {
    "NUM_ENVS": Cat([1, 2, 4, 8, 16]),
    "EP_LENGTH": Cat([64, 128, 256, 512, 1024, 2048]),
    "FRAME_STACK": Cat([2, 4, 8]),
    "BATCH_SIZE": Cat([32, 64, 128, 256, 512]),
    "N_EPOCHS": Cat([1, 4, 10]),
}
# The budget per mode: the smoke runs get a smaller one, so that only small rollouts run (two envs' 512-step
# rollouts are clamped to one env) and still part of the space is clamped or rejected. Minibatches per epoch
# are capped to keep trials short.
MODES = {"full": {"budget": "3GiB", "minibatches": 4}, "smoke": {"budget": "1.3GiB", "minibatches": 1}}


def worker_extras(n_workers: int) -> omp.Footprint:
    """Each worker process re-imports this script: Optuna and the guard on top of the calibrated worker."""
    stack = sb3_imports(atari=True)
    extra = (process(stack + _common.SCRIPT_IMPORTS, training=False).ram - process(stack, training=False).ram)
    return omp.Footprint.of(ram=max(0, extra) * n_workers, name=f"study imports in {n_workers} workers",
                            kind=omp.Kind.WORKERS)


def footprint(p: dict) -> omp.Footprint:
    params = {"n_steps": p["EP_LENGTH"], "batch_size": p["BATCH_SIZE"], "n_epochs": p["N_EPOCHS"],
              "torch_threads": THREADS}
    return (recipes.sb3("ppo", ENV_ID, params, n_envs=p["NUM_ENVS"], frame_stack=p["FRAME_STACK"],
                        vec_env="subproc")
            + _common.study_extras(sb3_imports(atari=True), torch_threads=THREADS)
            + worker_extras(p["NUM_ENVS"]))


def _cap_minibatches(model: PPO, per_epoch: int) -> None:
    """Train on the first ``per_epoch`` minibatches of each epoch (``get()`` still flattens the rollout)."""
    get = model.rollout_buffer.get
    model.rollout_buffer.get = lambda batch_size=None: itertools.islice(get(batch_size), per_epoch)


def make_objective(mode: dict, seed: int):
    @_common.released
    def objective(trial: optuna.Trial) -> float:
        p = _common.suggest(trial, SPACE)
        n_envs, n_steps = p["NUM_ENVS"], p["EP_LENGTH"]
        env = VecFrameStack(make_atari_env(ENV_ID, n_envs=n_envs, seed=seed + trial.number,
                                           vec_env_cls=SubprocVecEnv), p["FRAME_STACK"])
        try:
            model = PPO("CnnPolicy", env, n_steps=n_steps, batch_size=p["BATCH_SIZE"], n_epochs=p["N_EPOCHS"],
                        device="cpu", seed=seed + trial.number, verbose=0)
            _cap_minibatches(model, mode["minibatches"])
            callback = _common.RewardRate(trial, every=n_steps * n_envs)
            model.learn(n_steps * n_envs, callback=callback)  # one rollout, then one round of training
            return callback.value
        finally:
            env.close()

    return objective


def main() -> None:
    args = _common.arguments(__doc__, trials=12, smoke_trials=4)
    torch.set_num_threads(THREADS)
    mode = MODES["smoke" if args.smoke else "full"]
    study = _common.Study(
        name="ppo_pixels", space=SPACE, objective=make_objective(mode, args.seed), footprint=footprint,
        budget=omp.Budget(ram=mode["budget"]), clamp=["NUM_ENVS", "EP_LENGTH", "BATCH_SIZE"],
        show=tuple(SPACE), n_startup_trials=4, median_pruner=False,
        headline=f"footprint = recipes.sb3('ppo', {ENV_ID!r}, vec_env='subproc') + study imports "
                 f"(trial process and each worker); {mode['minibatches']} minibatch(es) per epoch",
    )
    _common.run(study, args)


if __name__ == "__main__":
    main()
