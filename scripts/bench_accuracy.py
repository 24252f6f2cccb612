"""Accuracy of predicted peak RSS (process tree) and thread count against real training runs.

Each configuration runs in a fresh subprocess (scripts/_workloads.py) while this process samples its tree;
the measured peak RSS is the sum of VmHWM over the tree (a child read between vfork and exec, which shows its
parent's memory, is left out of it, as the guard's monitor leaves it out), the measured threads the peak of
the tree's sum.
Three peer rules are computed side by side. Last line:
ACCURACY n=<N> ram_median_err=<x>% ram_p90_err=<x>% ram_max_err=<x>% ram_under5=<k> threads_within1=<m>/<N>
best_peer_median_err=<x>%

Usage: python scripts/bench_accuracy.py [--smoke] [--jobs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from optuna_memprune import format_bytes, procfs  # noqa: E402
from optuna_memprune.estimate import calibration, deque_buffer, process, recipes, torch_training  # noqa: E402
from optuna_memprune.procfs import field  # noqa: E402

ATARI = "ALE/Pong-v5"


def configs(smoke: bool) -> list[dict]:
    out = []
    # SB3 DQN CnnPolicy on Pong, frame stack 4, buffer filled to capacity before the last gradient steps.
    for buf in (10_000, 20_000):
        for omu in (False, True):
            for batch in (32, 256):
                out.append(
                    {
                        "kind": "sb3",
                        "algo": "dqn",
                        "env_id": ATARI,
                        "frame_stack": 4,
                        "n_envs": 1,
                        "torch_threads": 1,
                        "total_timesteps": buf + 200,
                        "params": {
                            "policy": "CnnPolicy",
                            "buffer_size": buf,
                            "batch_size": batch,
                            "optimize_memory_usage": omu,
                            "learning_starts": buf - 200,
                            "train_freq": 4,
                        },
                    }
                )
    # SB3 PPO on Atari: DummyVecEnv and SubprocVecEnv, 2 n_envs, 2 n_steps; two rollouts, one epoch each.
    for vec in ("dummy", "subproc"):
        for n_envs in (2, 4):
            for n_steps in (128, 256):
                out.append(
                    {
                        "kind": "sb3",
                        "algo": "ppo",
                        "env_id": ATARI,
                        "frame_stack": 4,
                        "n_envs": n_envs,
                        "vec_env": vec,
                        "torch_threads": 1,
                        "total_timesteps": 2 * n_steps * n_envs,
                        "params": {"policy": "CnnPolicy", "n_steps": n_steps, "batch_size": 256, "n_epochs": 1},
                    }
                )
    # SB3 DQN MlpPolicy with a large buffer (partly filled: lazily mapped pages count only once touched).
    out.append(
        {
            "kind": "sb3",
            "algo": "dqn",
            "env_id": "CartPole-v1",
            "n_envs": 1,
            "torch_threads": 1,
            "total_timesteps": 60_000,
            "params": {
                "policy": "MlpPolicy",
                "buffer_size": 2_000_000,
                "batch_size": 128,
                "learning_starts": 59_000,
                "net_arch": [256, 256],
            },
        }
    )
    # Pure torch training with Adam: 2 widths x 2 batch sizes, 1-2 torch threads; a CNN at 2 sizes.
    for arch, width, batch, threads in (
        ("mlp", 1024, 256, 1),
        ("mlp", 4096, 2048, 2),
        ("mlp", 4096, 256, 1),
        ("mlp", 1024, 2048, 2),
        ("cnn", 32, 64, 1),
        ("cnn", 64, 256, 2),
    ):
        out.append(
            {"kind": "torch", "arch": arch, "width": width, "batch_size": batch, "torch_threads": threads, "steps": 4}
        )
    # A deque-of-tuples replay buffer of Atari-sized frames (obs and next_obs stored separately).
    out.append({"kind": "deque", "obs_shape": [4, 84, 84], "maxlen": 15_000, "steps": 15_000, "batch_size": 32})
    if smoke:  # DQN on Pong, PPO dummy and subproc, DQN on CartPole, a torch MLP, the deque
        keep = {0, 8, 12, 16, 17, 23}
        out = [c for i, c in enumerate(out) if i in keep]
        for c in out:  # smaller runs, same shapes
            if c["kind"] == "sb3" and c["algo"] == "dqn" and c["env_id"] == ATARI:
                c["params"].update(buffer_size=2000, learning_starts=1800)
                c["total_timesteps"] = 2200
            if c["kind"] == "deque":
                c.update(maxlen=3000, steps=3000)
    return out


def name(cfg: dict) -> str:
    if cfg["kind"] == "sb3":
        p = cfg["params"]
        bits = [cfg["algo"], p["policy"].replace("Policy", ""), f"envs={cfg['n_envs']}"]
        if "buffer_size" in p:
            bits += [f"buf={p['buffer_size']}", f"omu={int(p.get('optimize_memory_usage', False))}"]
        if "n_steps" in p:
            bits += [cfg.get("vec_env", "dummy"), f"n_steps={p['n_steps']}"]
        bits.append(f"batch={p['batch_size']}")
        return " ".join(bits)
    if cfg["kind"] == "torch":
        return f"torch {cfg['arch']} w={cfg['width']} batch={cfg['batch_size']} threads={cfg['torch_threads']}"
    return f"deque maxlen={cfg['maxlen']} obs={tuple(cfg['obs_shape'])}"


# ---------------------------------------------------------------- predictions (ours and the peers')


def predict(cfg: dict):
    """Our footprint for the config."""
    if cfg["kind"] == "sb3":
        params = {k: v for k, v in cfg["params"].items() if k != "policy"}
        params["total_timesteps"] = cfg["total_timesteps"]
        params["torch_threads"] = cfg["torch_threads"]
        return recipes.sb3(
            cfg["algo"],
            cfg["env_id"],
            params,
            n_envs=cfg["n_envs"],
            frame_stack=cfg.get("frame_stack"),
            vec_env=cfg.get("vec_env", "dummy"),
        )
    if cfg["kind"] == "torch":
        from _workloads import TORCH_MODELS

        build, shape = TORCH_MODELS[cfg["arch"]]
        return process("torch", torch_threads=cfg["torch_threads"]) + torch_training(
            lambda: build(cfg["width"]),
            shape,
            batch_size=cfg["batch_size"],
            optimizer="adam",
            cache_key=("bench", cfg["arch"], cfg["width"]),
        )
    shape = tuple(cfg["obs_shape"])
    # The tutorial loop does ``state = next_state``: next_obs is the next transition's obs (counted once).
    transition = [(shape, "uint8"), int, float, None, bool]
    steps = min(cfg["steps"], cfg["maxlen"])
    return (
        process("torch", torch_threads=1)
        + deque_buffer(transition, maxlen=cfg["maxlen"], steps=steps)
        + torch_training(
            lambda: _deque_net(shape),
            shape,
            batch_size=cfg["batch_size"],
            input_dtype="uint8",
            cache_key=("bench", "deque-net", shape),
        )
    )


def _deque_net(shape):
    import torch.nn as nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 64), nn.ReLU(), nn.Linear(64, 6))


def peers(cfg: dict, fp) -> dict[str, int | None]:
    """Three rules people use today, each given the measured import baseline too (a fair start)."""
    base = sum(c.ram for c in fp.components if c.kind.value == "baseline")
    weights = sum(c.ram for c in fp.components if c.kind.value == "weights")
    transition, buffer_check, torchinfo_total = _transition_bytes(cfg), _sb3_check(cfg), _torchinfo(cfg)
    batch = cfg.get("batch_size") or cfg.get("params", {}).get("batch_size", 1)
    return {
        "x4_rule": base + 4 * weights + batch * transition,
        "torchinfo": None if torchinfo_total is None else base + torchinfo_total,
        "sb3_check": None if buffer_check is None else base + buffer_check,
    }


def _transition_bytes(cfg: dict) -> int:
    if cfg["kind"] == "torch":
        from _workloads import TORCH_MODELS

        return 4 * math.prod(TORCH_MODELS[cfg["arch"]][1])
    if cfg["kind"] == "deque":
        return 2 * math.prod(cfg["obs_shape"]) + 24
    if cfg["env_id"] == ATARI:
        return 2 * 84 * 84 * cfg.get("frame_stack", 1) + 16
    return 2 * 4 * 4 + 16


def _sb3_check(cfg: dict) -> int | None:
    """SB3's own ReplayBuffer size check (obs + next_obs + actions + rewards + dones, no timeouts)."""
    if cfg["kind"] != "sb3" or "buffer_size" not in cfg["params"]:
        return None
    p = cfg["params"]
    obs = 84 * 84 * cfg.get("frame_stack", 1) if cfg["env_id"] == ATARI else 4 * 4
    per = obs * (1 if p.get("optimize_memory_usage") else 2) + 8 + 4 + 4
    return per * p["buffer_size"]


def _torchinfo(cfg: dict) -> int | None:
    """torchinfo's "Estimated Total Size" for the trained network at the config's batch size."""
    if cfg["kind"] != "torch":
        return None
    import torchinfo
    from _workloads import TORCH_MODELS

    build, shape = TORCH_MODELS[cfg["arch"]]
    stats = torchinfo.summary(build(cfg["width"]), input_size=(cfg["batch_size"], *shape), verbose=0)
    total = stats.total_input + stats.total_output_bytes + stats.total_param_bytes
    return int(total)


# ---------------------------------------------------------------- measurement


def measure(cfg: dict) -> dict:
    env = dict(os.environ)
    if cfg.get("env_id", "").startswith("ALE/"):
        env["MEMPRUNE_BENCH_ATARI"] = "1"
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "_workloads.py"), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    hwm: dict[tuple[int, float], int] = {}
    peak_threads = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_threads
        root = psutil.Process(child.pid)
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                break
            statuses: dict[int, bytes] = {}
            for p in procs:
                try:
                    statuses[p.pid] = procfs.read(f"/proc/{p.pid}/status")
                except OSError:
                    continue
            peak_threads = max(peak_threads, sum(field(s, b"\nThreads:") for s in statuses.values()))
            for p in procs:
                status = statuses.get(p.pid)
                if status is None or procfs.shares_parent_memory(status, statuses):  # between vfork and exec
                    continue
                try:
                    key = (p.pid, p.create_time())
                except psutil.Error:
                    continue
                hwm[key] = max(hwm.get(key, 0), field(status, b"\nVmHWM:") * 1024)
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate(timeout=1200)
    stop.set()
    sampler.join()
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    if child.returncode != 0 or result is None:
        raise RuntimeError(f"{name(cfg)} failed ({child.returncode}): {err.strip().splitlines()[-3:]}")
    # The child's own end-of-run reading covers the peak of processes still alive then; the sampler covers
    # processes that came and went. Take the larger per process.
    own = sum(s["VmHWM"] for s in result["tree"])
    sampled = sum(hwm.values())
    return {"ram": max(own, sampled), "threads": peak_threads, "seconds": result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few small configurations (for tests)")
    parser.add_argument("--jobs", type=int, default=2, help="configurations measured at once (default 2)")
    parser.add_argument("--json", help="write the per-configuration figures to this file")
    args = parser.parse_args()
    start = time.perf_counter()
    cfgs = configs(args.smoke)
    # Predict first (calibrating on first use), in this process, before any measurement runs.
    predictions = [predict(c) for c in cfgs]

    def measure_or_none(cfg: dict) -> dict | None:
        try:
            m = measure(cfg)
        except Exception as exc:  # reported below; the other configurations still count
            print(f"FAILED {name(cfg)}: {exc}", flush=True)
            return None
        print(f"measured {name(cfg)} in {m['seconds']:.0f} s", flush=True)
        return m

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        measured = list(pool.map(measure_or_none, cfgs))
    failed = sum(m is None for m in measured)
    rows = []
    print(
        f"{'configuration':58s} {'pred RAM':>11s} {'meas RAM':>11s} {'err':>7s} {'thr p/m':>8s}  "
        f"{'x4 rule':>8s} {'torchinfo':>9s} {'sb3 chk':>8s}"
    )
    for cfg, fp, m in zip(cfgs, predictions, measured):
        if m is None:
            continue
        err = (fp.ram - m["ram"]) / m["ram"] * 100
        peer = {k: (None if v is None else (v - m["ram"]) / m["ram"] * 100) for k, v in peers(cfg, fp).items()}
        rows.append(
            {
                "config": name(cfg),
                "pred_ram": fp.ram,
                "meas_ram": m["ram"],
                "err_pct": err,
                "pred_threads": fp.threads,
                "meas_threads": m["threads"],
                "seconds": m["seconds"],
                "peers_err_pct": peer,
            }
        )
        fmt = lambda v: "-" if v is None else f"{v:+.0f}%"  # noqa: E731
        print(
            f"{name(cfg):58s} {format_bytes(fp.ram):>11s} {format_bytes(m['ram']):>11s} {err:+6.1f}% "
            f"{fp.threads:>3d}/{m['threads']:<4d}  {fmt(peer['x4_rule']):>8s} {fmt(peer['torchinfo']):>9s} "
            f"{fmt(peer['sb3_check']):>8s}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    abs_err = sorted(abs(r["err_pct"]) for r in rows)
    n = len(rows)
    p90 = abs_err[min(n - 1, math.ceil(0.9 * n) - 1)]
    under5 = sum(r["err_pct"] < -5 for r in rows)
    within1 = sum(abs(r["pred_threads"] - r["meas_threads"]) <= 1 for r in rows)
    peer_medians = {}
    for k in ("x4_rule", "torchinfo", "sb3_check"):
        vals = [abs(r["peers_err_pct"][k]) for r in rows if r["peers_err_pct"][k] is not None]
        if vals:
            peer_medians[k] = statistics.median(vals)
    print(
        f"peer median abs errors over the configs each applies to: "
        + ", ".join(f"{k}={v:.1f}%" for k, v in peer_medians.items())
    )
    print(f"wall time {time.perf_counter() - start:.0f} s, calibration file {calibration.load().path.name}")
    print(
        f"ACCURACY n={n} ram_median_err={statistics.median(abs_err):.1f}% ram_p90_err={p90:.1f}% "
        f"ram_max_err={abs_err[-1]:.1f}% ram_under5={under5} threads_within1={within1}/{n} "
        f"best_peer_median_err={min(peer_medians.values()):.1f}%" + (f" failed={failed}" if failed else "")
    )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
