"""Benchmark of network footprints: cached evaluation time and cold trace time (Nature-DQN, SB3's NatureCNN).

Prints one line per measurement and a final summary line
``PREDICT cached_median_ms=<x> cold_trace_s=<x>``.

- cached: ``torch_training`` on a network whose trace is cached, batch sizes varying, no result memo:
  every call evaluates the linear model, the peak and (for ``device="cuda"``) the allocator replay. The
  summary figure is the median over calls that pass ``cache_key`` (as recipes do), CPU and CUDA targets
  pooled; calls without a key also build the module on meta to derive one, printed separately.
- cold: the first ``torch_training`` call in a fresh interpreter, after ``import torch`` and the imports of
  the network's own code (SB3, gymnasium), so it includes torch's one-off warm-up of its Python meta
  kernels (which imports ``torch._dynamo``). The same is printed with ``torch._dynamo`` imported beforehand.

Run: ``python scripts/bench_predict.py [--repeats N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (8, 16, 32, 48, 64, 128, 256, 512, 1024, 2048)

_SETUP = """
import time, sys
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
import torch
import numpy as np
import gymnasium as gym
from torch import nn
from stable_baselines3.common.torch_layers import NatureCNN
{pre}
from optuna_memprune.estimate import torch_training

def nature_dqn():
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return nn.Sequential(NatureCNN(space, features_dim=512), nn.Linear(512, 6))
"""

_COLD = (
    _SETUP
    + """
t = time.perf_counter()
fp = torch_training(nature_dqn, (4, 84, 84), batch_size=32, input_dtype="uint8", optimizer="adam")
print(json.dumps({{"cold_s": time.perf_counter() - t, "ram": fp.ram}}))
"""
)


def cold_trace(pre_import_dynamo: bool) -> float:
    pre = "import torch._dynamo" if pre_import_dynamo else ""
    code = "import json\n" + _COLD.format(root=str(ROOT), pre=pre)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])["cold_s"]


def cached(repeats: int) -> dict[str, list[float]]:
    ns: dict = {}
    exec(_SETUP.format(root=str(ROOT), pre=""), ns)
    torch_training, nature_dqn = ns["torch_training"], ns["nature_dqn"]
    times: dict[str, list[float]] = {}
    for device in ("cpu", "cuda"):
        for keyed in (True, False):
            kw = dict(input_dtype="uint8", optimizer="adam", device=device, cache_key="nature-dqn" if keyed else None)
            torch_training(nature_dqn, (4, 84, 84), batch_size=32, **kw)  # fills the cache
            label = f"{device} {'cache_key' if keyed else 'derived key'}"
            times[label] = []
            for _ in range(repeats):
                for b in BATCHES:
                    t = time.perf_counter()
                    torch_training(nature_dqn, (4, 84, 84), batch_size=b, **kw)
                    times[label].append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="passes over the batch sizes (default 20)")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh interpreters for the cold time")
    args = parser.parse_args()

    times = cached(args.repeats)
    for label, ts in times.items():
        print(
            f"cached evaluation, {label:22s}: median {statistics.median(ts) * 1e3:7.3f} ms, "
            f"p90 {sorted(ts)[int(0.9 * len(ts))] * 1e3:7.3f} ms over {len(ts)} calls"
        )
    keyed = [t for label, ts in times.items() if "cache_key" in label for t in ts]
    cached_ms = statistics.median(keyed) * 1e3

    colds = [cold_trace(False) for _ in range(args.cold_runs)]
    warm_dynamo = [cold_trace(True) for _ in range(args.cold_runs)]
    print(
        f"cold Nature-DQN trace (fresh interpreter, after import torch): median {statistics.median(colds):.3f} s "
        f"of {[round(c, 3) for c in colds]}"
    )
    print(
        f"cold Nature-DQN trace with torch._dynamo imported beforehand: median "
        f"{statistics.median(warm_dynamo):.3f} s of {[round(c, 3) for c in warm_dynamo]}"
    )
    print(f"PREDICT cached_median_ms={cached_ms:.3f} cold_trace_s={statistics.median(colds):.3f}")


if __name__ == "__main__":
    main()
