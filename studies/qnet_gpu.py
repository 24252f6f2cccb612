"""A convolutional Q-network trained on replay batches, tuned for a small laptop GPU: 3.7 GiB of VRAM per trial.

Params: ``model`` (NatureCNN and wider variants), ``batch_size`` and ``n_envs`` (Pong envs filling a numpy
replay buffer of single 84x84 frames, ``n_envs`` x a fixed number of steps; observations are stacks of 4
consecutive frames gathered at sampling time, as in the DQN paper). A training step is the Q-learning
step: the online network forward and backward on a uint8 batch, the target copy forward on the next
observations, Adam. The footprint always predicts the VRAM of that step on a CUDA device
(``torch_training(..., device="cuda")``: the tensor timeline replayed through the caching-allocator model,
plus the CUDA context and cuBLAS workspace) and the guard budgets it; host RAM holds the process, the envs
and the buffer. With a GPU the trial trains there and records its real VRAM (the host RAM of CUDA's own
initialisation, hundreds of MB and version-dependent, is not in this footprint: calibrate on that host).
Without one (as where this was built) the VRAM side is a prediction only: the trial trains on the CPU, its
RAM footprint then includes the CPU training step as well, and the RAM budget is what the monitor enforces.
How close such VRAM predictions come on real GPUs is known only from others' published measurements
(``scripts/bench_vram_published.py``: the xMem paper's 141 released runs of torchvision CNNs and Hugging Face
transformers on RTX 3060/4060 and A100 GPUs, torch 2.6): all 141 predicted, median error 3.5% (xMem's own
2.7% on the same rows), 48 of the 116 rows that ran under-predicted, at most 22% off; every real
out-of-memory run predicted above the GPU's memory, 3 runs that fit predicted above it. Not this network,
not our GPU: those figures say how the method did there, not what this study's trials will use.

Run: ``python studies/qnet_gpu.py [--smoke] [--trials N] [--storage URL] [--seed S]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import ale_py  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from optuna.distributions import CategoricalDistribution as Cat  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from torch import nn  # noqa: E402

import optuna_memprune as omp  # noqa: E402
from optuna_memprune.estimate import array, process, torch_training  # noqa: E402
from optuna_memprune.estimate.recipes.sb3 import env_profile, sb3_imports  # noqa: E402
from optuna_memprune.estimate.processes import env_instances  # noqa: E402

gym.register_envs(ale_py)

ENV_ID = "ALE/Pong-v5"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THREADS = 2
STACK_FRAMES, FRAME = 4, (84, 84)
N_ACTIONS = 6
STACK = sb3_imports(atari=True) + _common.STUDY_IMPORTS
# Model size variants: conv channels (NatureCNN's 8x8/4, 4x4/2, 3x3/1 layers) and the hidden layer's width.
VARIANTS = {"nature": (32, 64, 64, 512), "wide": (64, 128, 128, 1024), "large": (128, 256, 256, 2048),
            "xlarge": (256, 512, 512, 4096), "xxlarge": (256, 512, 512, 8192)}
SPACE = {
    "model": Cat(list(VARIANTS)),
    "batch_size": Cat([32, 64, 128, 256, 512, 1024]),
    "n_envs": Cat([1, 2, 4, 8, 16]),
    "lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True),
}
# Per mode: the budget (smoke: a smaller GPU, so the small models still split), env steps per env that
# fill the buffer, and gradient updates (a large model's update takes seconds on a CPU).
MODES = {"full": {"budget": omp.Budget(ram="4GiB", vram="3.7GiB"), "steps": 192, "updates": 3},
         "smoke": {"budget": omp.Budget(ram="2GiB", vram="1GiB"), "steps": 48, "updates": 2}}


def qnet(model: str) -> nn.Module:
    c1, c2, c3, hidden = VARIANTS[model]
    return nn.Sequential(
        nn.Conv2d(STACK_FRAMES, c1, 8, 4), nn.ReLU(), nn.Conv2d(c1, c2, 4, 2), nn.ReLU(),
        nn.Conv2d(c2, c3, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(c3 * 7 * 7, hidden), nn.ReLU(),
        nn.Linear(hidden, N_ACTIONS),
    )


def _step(model: str, batch: int, device: str) -> omp.Footprint:
    return torch_training(lambda: qnet(model), (STACK_FRAMES, *FRAME), batch_size=batch, input_dtype="uint8",
                          optimizer="adam", frozen=1, device=device, cache_key=("qnet_gpu", model),
                          name=f"q-net ({device})")


def footprint(p: dict, mode: dict) -> omp.Footprint:
    n_envs, batch = p["n_envs"], p["batch_size"]
    profile = env_profile(ENV_ID, frame_stack=None)
    host = (process(STACK, torch_threads=THREADS) + env_instances(profile, n_envs)
            + array((mode["steps"], n_envs, *FRAME), "uint8", name="replay frames")
            + array((mode["steps"], n_envs, 3), "float32", name="actions, rewards, dones")
            + _common.MONITOR_THREAD)
    gpu = _step(p["model"], batch, "cuda")  # VRAM only (its RAM is 0)
    if DEVICE == "cuda":  # the sampled batches are staged in host memory, then copied to the GPU
        staged = array((2 * batch, STACK_FRAMES, *FRAME), "uint8", name="sampled batches (host)")
        return host + staged + gpu
    return host + gpu + _step(p["model"], batch, "cpu")


def sample(frames: np.ndarray, rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Stacks of 4 consecutive frames (and the next stacks) for random (step, env) pairs."""
    steps, n_envs = frames.shape[:2]
    t = rng.integers(STACK_FRAMES - 1, steps - 1, batch)
    e = rng.integers(0, n_envs, batch)
    window = t[:, None] + np.arange(1 - STACK_FRAMES, 1)
    return frames[window, e[:, None]], frames[window + 1, e[:, None]], (t, e)


def make_objective(mode: dict, seed: int):
    @_common.released
    def objective(trial: optuna.Trial) -> float:
        p = _common.suggest(trial, SPACE)
        n_envs, batch = p["n_envs"], p["batch_size"]
        rng = np.random.default_rng(seed + trial.number)
        frames = np.zeros((mode["steps"], n_envs, *FRAME), np.uint8)
        extras = np.zeros((mode["steps"], n_envs, 3), np.float32)  # action, reward, done
        env = make_atari_env(ENV_ID, n_envs=n_envs, seed=seed + trial.number)
        try:
            obs = env.reset()
            for t in range(mode["steps"]):  # warm-up with random actions fills the buffer
                actions = rng.integers(0, N_ACTIONS, n_envs)
                frames[t] = obs[..., 0]
                obs, rewards, dones, _ = env.step(actions)
                extras[t] = np.stack([actions, rewards, dones], 1)
        finally:
            env.close()
        device = torch.device(DEVICE)
        net = qnet(p["model"]).to(device)
        target = qnet(p["model"]).to(device)
        target.load_state_dict(net.state_dict())
        target.requires_grad_(False)
        opt = torch.optim.Adam(net.parameters(), lr=p["lr"])
        loss_value = float("nan")
        for update in range(mode["updates"]):
            obs_b, next_b, (t, e) = sample(frames, rng, batch)
            action, reward, done = (torch.from_numpy(extras[t, e, i]).to(device) for i in range(3))
            with torch.no_grad():
                best_next = target(torch.from_numpy(next_b).to(device).float() / 255).max(1).values
            q = net(torch.from_numpy(obs_b).to(device).float() / 255).gather(1, action.long()[:, None])[:, 0]
            loss = nn.functional.smooth_l1_loss(q, reward + 0.99 * (1 - done) * best_next)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_value = loss.item()
            trial.report(loss_value, update)
            if trial.should_prune():
                raise optuna.TrialPruned()
        if DEVICE == "cuda":
            trial.set_user_attr("torch_max_memory_reserved", torch.cuda.max_memory_reserved())
        return _common.finite_or(loss_value, 1e9)

    return objective


def main() -> None:
    args = _common.arguments(__doc__, trials=12, smoke_trials=4)
    torch.set_num_threads(THREADS)
    mode = MODES["smoke" if args.smoke else "full"]
    study = _common.Study(
        name="qnet_gpu", space=SPACE, objective=make_objective(mode, args.seed), direction="minimize",
        footprint=lambda p: footprint(p, mode), budget=mode["budget"], clamp=["batch_size"],
        show=("model", "batch_size", "n_envs"), n_startup_trials=4,
        headline=f"training on {DEVICE}; VRAM predicted for cuda" + ("" if DEVICE == "cuda" else
                                                                        " (no GPU here: predicted only)"),
    )
    _common.run(study, args)


if __name__ == "__main__":
    main()
