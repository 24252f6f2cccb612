"""Measures this host's baselines once, in fresh subprocesses, and caches them in a JSON keyed by versions.

Owns the probes (interpreter + imports + first training step, threads per torch thread, env instances and
env worker processes, CPU kernel workspaces) and the cache file; knows nothing of Optuna, psutil or how
figures are combined.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..exceptions import CalibrationError

_logger = logging.getLogger("optuna_memprune.estimate.calibration")

#: Libraries whose versions key the cache: a new version of any of them re-measures.
_VERSIONED = ("torch", "numpy", "stable-baselines3", "sb3-contrib", "gymnasium", "ale-py", "opencv-python-headless")
#: Torch thread counts at which the thread probe measures the process (a line is fitted through them).
_THREAD_POINTS = (1, 4)
_PROBE_TIMEOUT_S = 120
SCHEMA = 1

_STATUS_READER = r'''
import json, os, sys
def _status(pid="self"):
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
def _children(root):
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c); todo.append(c)
    return out
'''

# Imports a stack, sets the torch thread count, runs a matmul and (if asked) a tiny training step (the
# first optimizer imports about 800 modules of torch's compiler stack: tens of MB, once), and measures.
# One process per thread count: torch sizes its pools at first use.
_STACK_PROBE = _STATUS_READER + r'''
import importlib
spec = json.loads(sys.argv[1])
for mod in spec["imports"]:
    importlib.import_module(mod)
result = {"imports": _status()}
if "torch" in spec["imports"]:
    import torch
    result["default_torch_threads"] = torch.get_num_threads()
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 14 * 14, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(net.parameters()) if spec["train"] else None
    def step():
        if opt is None:
            with torch.no_grad():
                net(torch.zeros(8, 4, 16, 16))
            return
        for _ in range(3):
            net(torch.zeros(8, 4, 16, 16)).square().mean().backward(); opt.step(); opt.zero_grad()
    torch.set_num_threads(spec["threads"])
    a = torch.ones(512, 512)
    for _ in range(4):
        (a @ a).sum()
    step()
    result["warm"] = _status()
else:
    result["warm"] = _status()
print("PROBE" + json.dumps(result))
'''

# Builds the env the way SB3 would (Atari wrappers and frame stack where asked), in one process and in
# SubprocVecEnv workers, and measures what one env instance and one worker process cost.
_ENV_PROBE = _STATUS_READER + r'''
import importlib, gc
spec = json.loads(sys.argv[1])
for mod in spec["imports"]:
    importlib.import_module(mod)
import numpy as np
import gymnasium as gym
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack
try:
    import ale_py
    gym.register_envs(ale_py)
except ImportError:  # not an Atari stack
    pass
def main():
    def make(n, cls):
        kw = {"n_envs": n, "seed": 0, "vec_env_cls": cls}
        env = make_atari_env(spec["env_id"], **kw) if spec["atari"] else make_vec_env(spec["env_id"], **kw)
        if spec["frame_stack"]:
            env = VecFrameStack(env, spec["frame_stack"])
        return env
    def run(env, steps):
        env.reset()
        for _ in range(steps):
            env.step(np.array([env.action_space.sample() for _ in range(env.num_envs)]))
    before = _status()
    e1 = make(1, DummyVecEnv); run(e1, spec["steps"]); one = _status()
    e3 = make(3, DummyVecEnv); run(e3, spec["steps"]); four = _status()
    space_o, space_a = e1.observation_space, e1.action_space
    def describe(s):
        d = {"type": type(s).__name__, "shape": list(s.shape or ()), "dtype": str(s.dtype) if s.dtype is not None else None}
        if hasattr(s, "n") and not hasattr(s, "nvec"):
            d["n"] = int(s.n)
        if hasattr(s, "nvec"):
            d["nvec"] = [int(x) for x in np.ravel(s.nvec)]
        if isinstance(s, gym.spaces.Dict):
            d["spaces"] = {k: describe(v) for k, v in s.spaces.items()}
        return d
    result = {"before": before, "one": one, "four": four,
              "observation_space": describe(space_o), "action_space": describe(space_a)}
    e1.close(); e3.close(); del e1, e3; gc.collect()
    if spec["subproc"]:
        me = os.getpid()
        main_before = _status()
        sv = make(2, SubprocVecEnv); run(sv, spec["steps"])
        during = {pid: _status(pid) for pid in _children(me)}
        main_during = _status()
        sv.close()
        import time
        time.sleep(0.3)
        remaining = set(_children(me))
        workers = [s for pid, s in during.items() if pid not in remaining and s]
        helpers = [s for pid, s in during.items() if pid in remaining and s]
        result["subproc"] = {"workers": workers, "helpers": helpers,
                             "main_delta": main_during["VmRSS"] - main_before["VmRSS"]}
    print("PROBE" + json.dumps(result))
if __name__ == "__main__":  # SubprocVecEnv workers re-import this file
    main()
'''

# Measures the buffers oneDNN convolutions allocate inside the op (outside torch's dispatcher), on reference
# convolutions chosen unlike any benchmark model: per op, VmHWM - VmRSS before (the peak reset through
# /proc/self/clear_refs) - the bytes of its outputs. glibc's mmap threshold is pinned low so every large
# buffer is a fresh mapping returned at free: the figure is the op's own peak, not what the heap had cached.
# The features (bytes per rule) come from torchnet's own table, so probe and estimator cannot drift apart.
_KERNEL_PROBE = _STATUS_READER + r"""
import ctypes, itertools
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["root"])  # this package, wherever it is imported from
def peak_of(call):
    peaks = []
    for _ in range(3):  # the median of three: a few small allocations of the interpreter come and go
        out = None
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status()["VmRSS"]
        out = call()
        peaks.append(_status()["VmHWM"] - before)
    return out, sorted(peaks)[1]
def mapped(t):
    return -(-t.untyped_storage().nbytes() // 4096) * 4096
def measure(torch, torchnet):
    aten = torch.ops.aten
    block = torchnet._channel_block()
    rows = []
    for ci, co, k, stride, size, batch, grad_in in spec["convs"]:
        x, w, b = torch.rand(batch, ci, size, size), torch.rand(co, ci, k, k), torch.rand(co)
        geo = ([stride, stride], [k // 2, k // 2], [1, 1], False, [0, 0], 1)
        fwd_args = (x, w, b, *geo)
        fwd = lambda: aten.convolution.default(*fwd_args)
        gy = torch.rand_like(fwd())
        bwd_args = (gy, x, w, [co], *geo, [grad_in, True, True])
        bwd = lambda: aten.convolution_backward.default(*bwd_args)
        for _ in range(2):  # primitive creation and its caches are one-off
            fwd(); bwd()
        y, peak = peak_of(fwd)
        rows.append({"op": "fwd", "measured": max(0, peak - mapped(y)),
                     "features": torchnet._workspace_features(aten.convolution.default, fwd_args, {}, y, block)})
        grads, peak = peak_of(bwd)
        rows.append({"op": "bwd", "measured": max(0, peak - sum(mapped(g) for g in grads if g is not None)),
                     "features": torchnet._workspace_features(aten.convolution_backward.default, bwd_args, {},
                                                              grads, block)})
    return rows, block
def fit(torch, rules_all, rows):
    # Per op kind, bytes = sum(coefficient x feature): least squares on the relative error, coefficients >= 0
    # (every subset of the op's rules is solved; the best non-negative solution wins).
    coef = [0.0] * len(rules_all)
    for op in ("fwd", "bwd"):
        mine = [r for r in rows if r["op"] == op and r["measured"] > 0]
        rules = sorted({k for r in mine for k, _ in r["features"]})
        best = None
        for n in range(1, len(rules) + 1):
            for subset in itertools.combinations(rules, n):
                a = torch.tensor([[dict(r["features"]).get(k, 0) / r["measured"] for k in subset] for r in mine],
                                 dtype=torch.float64)
                sol = torch.linalg.lstsq(a, torch.ones(len(mine), 1, dtype=torch.float64)).solution.flatten()
                if bool((sol >= 0).all()):
                    err = float(((a @ sol) - 1).square().sum())
                    if best is None or err < best[0]:
                        best = (err, subset, sol.tolist())
        if best is not None:
            for k, c in zip(best[1], best[2]):
                coef[k] = round(c, 4)
    return coef
try:
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD, fixed: no dynamic raise
    with open("/proc/self/clear_refs", "w") as f:     # resets VmHWM (Linux >= 4.0)
        f.write("5")
    import torch
    from optuna_memprune.estimate import torchnet
    torch.set_num_threads(1)
    rows, block = measure(torch, torchnet)
    result = {"rows": rows, "block": block, "rules": list(torchnet.WORKSPACE_RULES),
              "coef": fit(torch, torchnet.WORKSPACE_RULES, rows)}
except (OSError, AttributeError, RuntimeError) as e:  # no glibc, no clear_refs, no oneDNN
    result = {"error": f"{type(e).__name__}: {e}"}
print("PROBE" + json.dumps(result))
"""
# Where the kernel probe cannot measure: its fit on the development host (AVX-512 EPYC, glibc 2.36, torch
# 2.13 with oneDNN 3.12), per torchnet.WORKSPACE_RULES.
_DEFAULT_KERNEL_COEF = {"conv_fwd_in": 0.44, "conv_fwd_out": 0.80, "conv_bwd_in": 1.0, "conv_bwd_out": 0.80,
                        "conv_bwd_grad_in": 0.15}
# Reference convolutions of the kernel probe: (in channels, out channels, kernel, stride, height = width,
# batch, input gradient). Odd sizes on purpose, none of them a layer of the benchmark's or SB3's networks.
_KERNEL_CONVS = (
    (5, 24, 5, 2, 50, 64, False), (12, 20, 3, 1, 30, 64, True), (24, 40, 3, 1, 24, 64, True),
    (40, 80, 3, 2, 26, 64, True), (48, 48, 3, 1, 20, 64, True), (80, 96, 1, 1, 14, 64, True),
    (96, 48, 3, 1, 10, 96, True), (16, 56, 5, 1, 18, 64, True), (56, 24, 3, 1, 22, 48, False),
)


def versions() -> dict[str, str]:
    """The interpreter, platform and library versions that key the calibration cache."""
    out = {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def cache_dir() -> Path:
    """Where calibrations live: ``$MEMPRUNE_CACHE_DIR`` or ``~/.cache/optuna-memprune``."""
    env = os.environ.get("MEMPRUNE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "optuna-memprune"


def _key(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _run_probe(code: str, spec: dict, *, timeout: float = _PROBE_TIMEOUT_S) -> dict:
    env = dict(os.environ)  # the same allocator and threading settings the trials will see
    # A real script file, not ``-c``: multiprocessing's forkserver preloads ``__main__`` into env workers,
    # which is how their Atari envs get registered (gymnasium needs ``import ale_py`` in each process).
    with tempfile.TemporaryDirectory(prefix="memprune-probe-") as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(code)
        try:
            proc = subprocess.run([sys.executable, str(script), json.dumps(spec)], capture_output=True,
                                  text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired as exc:
            raise CalibrationError(f"calibration probe {spec} timed out after {timeout:.0f} s") from exc
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE"):
            return json.loads(line[5:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    raise CalibrationError(f"calibration probe {spec} failed (exit {proc.returncode}): " + " | ".join(tail))


@dataclass(frozen=True)
class StackBaseline:
    """What a process that imported ``imports`` (and ran one tiny training step if ``train``) costs.

    All numbers are bytes except thread counts. ``threads_at(n)`` and ``thread_ram`` come from a line fitted
    through measurements at several torch thread counts.
    """

    imports: tuple[str, ...]
    train: bool
    ram: int                      # VmHWM after imports (+ warm-up step), torch at 1 thread
    threads_base: float           # fitted thread count at 0 torch threads (intercept)
    threads_per_torch_thread: float
    ram_per_torch_thread: int
    default_torch_threads: int

    def threads_at(self, torch_threads: int) -> int:
        return int(round(self.threads_base + self.threads_per_torch_thread * torch_threads))


@dataclass(frozen=True)
class EnvProfile:
    """An environment as SB3 builds it: its spaces, the RSS of one instance, one SubprocVecEnv worker."""

    env_id: str
    atari: bool
    frame_stack: int | None
    observation_space: dict
    action_space: dict
    first_env_ram: int            # the first instance in a process (lazy module state, ROM load)
    env_ram: int                  # each further instance in the same process
    worker_ram: int = 0           # VmHWM of one SubprocVecEnv worker process
    worker_threads: int = 0
    helper_ram: int = 0           # forkserver and resource tracker, once per process tree
    helper_threads: int = 0
    helper_processes: int = 0


@dataclass(frozen=True)
class CpuKernels:
    """What CPU kernels allocate outside torch's dispatcher on this host, as measured by the kernel probe.

    ``coefficients[i]`` multiplies the feature bytes of rule ``rules[i]`` (torchnet's ``WORKSPACE_RULES``:
    an operand's bytes with its channels padded to ``block``). ``measured`` is False where the probe could
    not measure (not glibc, no ``/proc/self/clear_refs``): the coefficients are then ``_DEFAULT_KERNEL_COEF``.
    """

    rules: tuple[str, ...]
    coefficients: tuple[float, ...]
    block: int
    measured: bool = True

    def coefficient(self, rule: str) -> float:
        return self.coefficients[self.rules.index(rule)] if rule in self.rules else 0.0


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


@dataclass
class Calibration:
    """This host's measured baselines, loaded from (and saved to) the cache file for these versions."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)  # atomic: concurrent readers never see half a file

    def stack(self, imports: Iterable[str], *, train: bool = True) -> StackBaseline:
        """The baseline of a process importing ``imports``; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        if "torch" not in imports:
            train = False
        key = f"stack:{','.join(imports)}:{int(train)}"
        with self._lock:
            raw = self.data.setdefault("stacks", {}).get(key)
            if raw is None:
                _logger.info("Calibrating the baseline of a process importing %s (one-off, a few seconds).",
                             ", ".join(imports) or "nothing")
                points = _THREAD_POINTS if "torch" in imports else (1,)
                with ThreadPoolExecutor(max_workers=2) as pool:
                    probes = list(pool.map(lambda n: _run_probe(_STACK_PROBE, {
                        "imports": list(imports), "train": train, "threads": n}), points))
                raw = {"points": [[n, p] for n, p in zip(points, probes)]}
                self.data["stacks"][key] = raw
                self.save()
        points = raw["points"]
        first = points[0][1]
        t0, t1 = _fit([(n, p["warm"]["Threads"]) for n, p in points])
        _, r1 = _fit([(n, p["warm"]["VmHWM"]) for n, p in points])
        return StackBaseline(
            imports=imports, train=train, ram=first["warm"]["VmHWM"],
            threads_base=t0, threads_per_torch_thread=t1, ram_per_torch_thread=max(0, int(r1)),
            default_torch_threads=int(first.get("default_torch_threads", 1)),
        )

    def cpu_kernels(self) -> CpuKernels:
        """The CPU kernel workspace coefficients of this host; measured now (and cached) if never measured.

        One probe process (about 4 s): reference convolutions, forward and backward, each op's peak RSS above
        its inputs and outputs (see ``_KERNEL_PROBE``), fitted per op kind on torchnet's workspace features.
        """
        with self._lock:
            raw = self.data.get("cpu_kernels")
            if raw is None:
                _logger.info("Calibrating CPU kernel workspaces (one-off, a few seconds).")
                raw = _run_probe(_KERNEL_PROBE, {"convs": [list(c) for c in _KERNEL_CONVS],
                                                 "root": str(Path(__file__).resolve().parents[2])})
                self.data["cpu_kernels"] = raw
                self.save()
        if "error" in raw:
            _logger.warning("CPU kernel workspaces not measured here (%s): using the default coefficients.",
                            raw["error"])
            return CpuKernels(rules=tuple(_DEFAULT_KERNEL_COEF), coefficients=tuple(_DEFAULT_KERNEL_COEF.values()),
                              block=0, measured=False)
        return CpuKernels(rules=tuple(raw["rules"]), coefficients=tuple(float(c) for c in raw["coef"]),
                          block=int(raw["block"]))

    def env(self, env_id: str, *, atari: bool, frame_stack: int | None, imports: Iterable[str],
            subproc: bool = True) -> EnvProfile:
        """The profile of ``env_id`` as SB3 builds it; measured now (and cached) if never measured."""
        imports = tuple(sorted(set(imports)))
        spec = {"env_id": env_id, "atari": bool(atari), "frame_stack": frame_stack or 0,
                "imports": list(imports), "steps": 200, "subproc": bool(subproc)}
        key = "env:" + _key(spec)
        with self._lock:
            raw = self.data.setdefault("envs", {}).get(key)
            if raw is None:
                _logger.info("Calibrating environment %s (one-off, about 10 s).", env_id)
                raw = _run_probe(_ENV_PROBE, spec)
                self.data["envs"][key] = raw
                self.save()
        one = raw["one"]["VmHWM"] - raw["before"]["VmHWM"]
        each = max(0, (raw["four"]["VmHWM"] - raw["one"]["VmHWM"]) // 3)
        sub = raw.get("subproc") or {"workers": [], "helpers": []}
        workers = sub["workers"] or [{"VmHWM": 0, "Threads": 0}]
        return EnvProfile(
            env_id=env_id, atari=atari, frame_stack=frame_stack,
            observation_space=raw["observation_space"], action_space=raw["action_space"],
            first_env_ram=max(one, each), env_ram=each,
            worker_ram=max(w["VmHWM"] for w in workers), worker_threads=max(w["Threads"] for w in workers),
            helper_ram=sum(h["VmHWM"] for h in sub["helpers"]),
            helper_threads=sum(h["Threads"] for h in sub["helpers"]),
            helper_processes=len(sub["helpers"]),
        )


_CURRENT: Calibration | None = None
_CURRENT_LOCK = threading.Lock()


def load(path: Path | str | None = None) -> Calibration:
    """The calibration for this environment (versions), read from the cache; probes run on first use."""
    global _CURRENT
    if path is None:
        with _CURRENT_LOCK:
            want = cache_dir() / f"calibration-{_key(versions())}.json"
            if _CURRENT is None or _CURRENT.path != want:
                _CURRENT = _read(want)
            return _CURRENT
    return _read(Path(path))


def _read(path: Path) -> Calibration:
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            data = {}
    except (OSError, ValueError):
        data = {}
    data.setdefault("schema", SCHEMA)
    data.setdefault("versions", versions())
    return Calibration(path, data)


def calibrate(*, env_ids: Sequence[str] = (), force: bool = False) -> tuple[Calibration, float]:
    """Measure the default stacks (and the given Atari/gym envs) now; returns the calibration and seconds."""
    start = time.perf_counter()
    cal = load()
    if force:
        with cal._lock:
            cal.data = {"schema": SCHEMA, "versions": versions()}
    from .processes import DEFAULT_STACKS  # the stacks the estimators ask for

    for imports in DEFAULT_STACKS:
        if all(_importable(m) for m in imports):
            cal.stack(imports)
    if _importable("torch"):
        cal.cpu_kernels()
    for env_id in env_ids:
        atari = env_id.startswith("ALE/")
        cal.env(env_id, atari=atari, frame_stack=4 if atari else None,
                imports=sb3_imports(atari))
    return cal, time.perf_counter() - start


def sb3_imports(atari: bool) -> tuple[str, ...]:
    """What a process training SB3 imports (Atari adds ALE and OpenCV): the stack its baseline is."""
    return ("torch", "stable_baselines3", "gymnasium") + (("ale_py", "cv2") if atari else ())


def _importable(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None
