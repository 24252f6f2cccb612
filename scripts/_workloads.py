"""Real training workloads for the accuracy benchmark; each runs in a fresh process and reports its peaks.

Run as ``python scripts/_workloads.py '<json config>'``: the config's ``kind`` picks the workload. At the end
the process prints one ``RESULT {json}`` line with VmHWM and threads of itself and its live descendants.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

if os.environ.get("MEMPRUNE_BENCH_ATARI"):
    # Atari envs must be registered in every process: SubprocVecEnv workers re-import this file as __main__.
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)


def _status(pid="self") -> dict | None:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(val.split()[0]) * 1024
                elif key == "Threads":
                    out[key] = int(val.split()[0])
    except OSError:
        return None
    return out


def _tree_status() -> list[dict]:
    import psutil

    me = psutil.Process()
    out = [_status()]
    for child in me.children(recursive=True):
        s = _status(child.pid)
        if s:
            out.append(s)
    return out


def run_sb3(cfg: dict) -> None:
    import torch
    from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg["torch_threads"])
    cls = {"dqn": DQN, "ppo": PPO, "a2c": A2C, "sac": SAC, "td3": TD3}[cfg["algo"]]
    vec_cls = SubprocVecEnv if cfg.get("vec_env") == "subproc" else DummyVecEnv
    n_envs = cfg.get("n_envs", 1)
    if cfg["env_id"].startswith("ALE/"):
        env = make_atari_env(cfg["env_id"], n_envs=n_envs, seed=0, vec_env_cls=vec_cls)
    else:
        env = make_vec_env(cfg["env_id"], n_envs=n_envs, seed=0, vec_env_cls=vec_cls)
    if cfg.get("frame_stack"):
        env = VecFrameStack(env, cfg["frame_stack"])
    params = dict(cfg["params"])
    policy = params.pop("policy")
    if "net_arch" in params:
        params["policy_kwargs"] = {"net_arch": params.pop("net_arch")}
    if params.get("optimize_memory_usage"):
        params["replay_buffer_kwargs"] = {"handle_timeout_termination": False}
    model = cls(policy, env, device="cpu", seed=0, verbose=0, **params)
    model.learn(cfg["total_timesteps"])
    cfg["_tree"] = _tree_status()  # before the workers are closed
    env.close()


def _mlp(width: int, depth: int = 3):
    import torch.nn as nn

    layers, d = [], 512
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))


def _cnn(width: int):
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 16 * 16, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


TORCH_MODELS = {"mlp": (_mlp, (512,)), "cnn": (_cnn, (3, 64, 64))}


def run_torch(cfg: dict) -> None:
    import torch

    torch.set_num_threads(cfg["torch_threads"])
    build, shape = TORCH_MODELS[cfg["arch"]]
    model = build(cfg["width"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(cfg.get("steps", 5)):
        x = torch.randn(cfg["batch_size"], *shape)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_deque(cfg: dict) -> None:
    """The tutorial DQN pattern: a deque of (obs, action, reward, next_obs, done) tuples of numpy arrays."""
    import collections
    import random

    import numpy as np
    import torch

    torch.set_num_threads(1)
    shape = tuple(cfg["obs_shape"])
    memory = collections.deque(maxlen=cfg["maxlen"])
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, shape, dtype=np.uint8)
    for step in range(cfg["steps"]):
        nxt = rng.integers(0, 255, shape, dtype=np.uint8)
        memory.append((obs, int(rng.integers(6)), float(rng.random()), nxt, bool(step % 100 == 99)))
        obs = nxt
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), 64), torch.nn.ReLU(), torch.nn.Linear(64, 6)
    )
    opt = torch.optim.Adam(net.parameters())
    for _ in range(5):
        batch = random.sample(memory, cfg["batch_size"])
        x = torch.as_tensor(np.stack([t[0] for t in batch])).float() / 255
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    start = time.perf_counter()
    logs = None
    if "SB3_LOGDIR" not in os.environ:  # else SB3's learn() leaves a folder SB3-<date> in the temporary directory
        logs = os.environ["SB3_LOGDIR"] = tempfile.mkdtemp(prefix="bench-sb3-")
    try:
        {"sb3": run_sb3, "torch": run_torch, "deque": run_deque}[cfg["kind"]](cfg)
    finally:  # a workload that raised too
        if logs:
            shutil.rmtree(logs, ignore_errors=True)
    tree = cfg.get("_tree") or _tree_status()
    print("RESULT " + json.dumps({"tree": tree, "seconds": time.perf_counter() - start}), flush=True)
    os._exit(0)  # done (SubprocVecEnv's workers closed): skip the teardown, 1.4 s of CPU after torch training


if __name__ == "__main__":
    main()
