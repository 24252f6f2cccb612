"""CPU training steps predicted by torch_training against the peak RSS of real fresh processes on this host.

What is compared: in a fresh process that has imported torch and run a tiny warm-up training step (so torch's
one-off first-step costs are in the baseline, as ``process()`` counts them), the step RSS is
``VmHWM - VmRSS`` where VmRSS is read, and VmHWM reset to it through ``/proc/self/clear_refs``, just before the
model, optimizer and batch are built; then a few training steps of SB3's order run (``zero_grad``,
forward, mean of the outputs, backward, Adam step) at one torch thread. The prediction is
``torch_training(...).ram``: weights, gradients, optimizer state, activations and temporaries (the traced
tensor peak), the oneDNN kernel workspaces (coefficients calibrated on this host) and glibc's heap retention.

Two regimes:
- ``MALLOC_MMAP_THRESHOLD_`` fixed (glibc's dynamic threshold off: freed buffers go back to the OS at once):
  RSS is deterministic and equals tensors + kernel workspaces; the prediction reads the same variable and
  keeps only the few small storages below the threshold as heap retention. This checks the workspace model
  tightly.
- glibc's default: freed heap chunks stay resident and identical runs differ by up to +-30% (see
  ``estimate.heap.RETENTION``; e.g. the MLP below measured 103-167 MiB over six steps in repeated runs,
  predicted 122 MiB). A 10% bound cannot hold for a single run, nor reliably for a median of a few; the
  prediction is checked against the median of five runs within 30% (a median of three within 25% failed
  once in a full suite run: the CNN at batch 32 measured 198, 223 and 198 MB, predicted 255 MB), and must
  beat the traced tensors alone, which miss 20-50% here.

None of these networks or shapes is one of the calibration probe's reference convolutions.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from optuna_memprune.estimate import torch_training, torchnet  # noqa: E402

# one test process for the module: split, each process ran the whole fixture (19 real training processes)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchnet_cpu_rss")]

STEPS = {"fixed": 4, "default": 6}  # a fixed threshold is steady from the 2nd step; the heap creeps on
FIXED_THRESHOLD = "131072"

if not os.access("/proc/self/clear_refs", os.W_OK):  # pragma: no cover - Linux < 4.0 or a locked-down /proc
    pytest.skip("needs /proc/self/clear_refs to reset VmHWM", allow_module_level=True)


# The networks, as source: the child process builds exactly what the prediction traces.
NETS = {
    "cnn": """
def build():
    w = 32
    return nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * w * 16 * 16, 256), nn.ReLU(), nn.Linear(256, 10))
SHAPE, DTYPE = (3, 64, 64), "float32"
""",
    "nature_cnn": """
def build():  # SB3's NatureCNN on a 4-frame Atari stack + a 6-action head
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 6))
SHAPE, DTYPE = (4, 84, 84), "uint8"
""",
    "mlp": """
def build():
    layers, d = [], 512
    for _ in range(3):
        layers += [nn.Linear(d, 1024), nn.ReLU()]
        d = 1024
    return nn.Sequential(*layers, nn.Linear(d, 10))
SHAPE, DTYPE = (512,), "float32"
""",
}

CHILD = r"""
import gc, json, sys
import torch
from torch import nn
spec = json.loads(sys.argv[1])
exec(spec["net"])
def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(val.split()[0]) * 1024
    return out
torch.set_num_threads(1)
warm = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 32), nn.Linear(32, 4))
warm_opt = torch.optim.Adam(warm.parameters())
for _ in range(3):
    warm(torch.zeros(8, 4, 16, 16)).square().mean().backward(); warm_opt.step(); warm_opt.zero_grad()
del warm, warm_opt
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status()["VmRSS"]
net = build()
opt = torch.optim.Adam(net.parameters())
x = torch.zeros(spec["batch"], *SHAPE, dtype=getattr(torch, DTYPE))
def step():
    opt.zero_grad(set_to_none=True)
    inp = x.float() / 255 if x.dtype == torch.uint8 else x
    net(inp).mean().backward()
    opt.step()
for _ in range(spec["steps"]):
    step()
print("RESULT" + json.dumps({"step_rss": status()["VmHWM"] - before}), flush=True)
import os
os._exit(0)  # measured: the interpreter's teardown after training took 1.4 s of CPU of the child's 11
"""


def _measure(arch: str, batch: int, regime: str) -> int:
    spec = {"net": textwrap.dedent(NETS[arch]), "batch": batch, "steps": STEPS[regime]}
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    if regime == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = FIXED_THRESHOLD
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=120
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[6:])["step_rss"]
    raise AssertionError(f"child failed: {out.stderr[-2000:]}")


def _predict(arch: str, batch: int) -> tuple[int, dict, int]:
    """The prediction, its parts, and the traced tensor peak alone (what torch_training predicted before)."""
    scope: dict = {"nn": nn}
    exec(textwrap.dedent(NETS[arch]), scope)
    args = (scope["build"], scope["SHAPE"])
    fp = torch_training(*args, batch_size=batch, input_dtype=scope["DTYPE"])
    tensors = torchnet.trace(*args, batch_size=batch, input_dtype=scope["DTYPE"]).peak
    return fp.ram, {c.name: c.ram for c in fp.components}, tensors


FIXED_CASES = [("cnn", 32), ("cnn", 64), ("nature_cnn", 256), ("mlp", 2048)]
DEFAULT_CASES = [("cnn", 32), ("nature_cnn", 256), ("mlp", 2048)]
DEFAULT_RUNS = 5


@pytest.fixture(scope="module")
def real_runs():
    """Real step RSS of every case: one run per fixed-threshold case (deterministic), three per default one.

    All in one pool of two workers (about 30 s on two cores).
    """
    jobs = [(case, "fixed") for case in FIXED_CASES] + [
        (case, "default") for case in DEFAULT_CASES for _ in range(DEFAULT_RUNS)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: _measure(*job[0], job[1]), jobs))
    out: dict = {}
    for (case, regime), rss in zip(jobs, results):
        out.setdefault((case, regime), []).append(rss)
    return out


@pytest.mark.parametrize("arch,batch", FIXED_CASES)
def test_tensors_plus_kernel_workspaces_match_real_step_rss_with_a_fixed_mmap_threshold(
    arch, batch, real_runs, monkeypatch
):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", FIXED_THRESHOLD)
    predicted, parts, _ = _predict(arch, batch)
    assert parts.get("network allocator overhead", 0) < 0.02 * predicted  # nothing large stays on the heap
    [real] = real_runs[((arch, batch), "fixed")]
    assert abs(predicted - real) / real <= 0.10, (arch, batch, predicted, real, parts)


def test_kernel_workspaces_are_what_closes_the_gap_for_convolutions(real_runs, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", FIXED_THRESHOLD)
    predicted, parts, tensors = _predict("nature_cnn", 256)
    [real] = real_runs[(("nature_cnn", 256), "fixed")]
    assert parts["network kernel workspaces"] > 0.2 * real
    assert (real - tensors) / real > 0.2  # the traced tensors alone miss more than 20%


@pytest.mark.parametrize("arch,batch", DEFAULT_CASES)
def test_prediction_matches_the_median_real_step_rss_under_default_glibc(arch, batch, real_runs, monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    predicted, parts, tensors = _predict(arch, batch)
    runs = real_runs[((arch, batch), "default")]
    real = statistics.median(runs)
    assert abs(predicted - real) / real <= 0.30, (arch, batch, predicted, runs, parts)
    assert abs(predicted - real) < abs(tensors - real), (arch, batch, predicted, tensors, runs)
