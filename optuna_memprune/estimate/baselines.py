"""What the calibration probes measure, as values (StackBaseline, EnvProfile, CpuKernels), and how a probe runs.

Knows nothing of the cache file, of Footprints, or of what a probe does inside its interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..exceptions import CalibrationError
from .probes import MARK

#: Torch thread counts at which the stack probe measures the process (a line is fitted through them).
THREAD_POINTS = (1, 4)
PROBE_TIMEOUT_S = 120
# Where the kernel probe cannot measure: its fit on the development host (AVX-512 EPYC, glibc 2.36, torch
# 2.13 with oneDNN 3.12), per torchnet.WORKSPACE_RULES.
DEFAULT_KERNEL_COEF = {"conv_fwd_in": 0.44, "conv_fwd_out": 0.80, "conv_bwd_in": 1.0, "conv_bwd_out": 0.80,
                       "conv_bwd_grad_in": 0.15}
#: Reference convolutions of the kernel probe: (in channels, out channels, kernel, stride, height = width,
#: batch, input gradient). Odd sizes on purpose, none of them a layer of the benchmark's or SB3's networks.
KERNEL_CONVS = (
    (5, 24, 5, 2, 50, 64, False), (12, 20, 3, 1, 30, 64, True), (24, 40, 3, 1, 24, 64, True),
    (40, 80, 3, 2, 26, 64, True), (48, 48, 3, 1, 20, 64, True), (80, 96, 1, 1, 14, 64, True),
    (96, 48, 3, 1, 10, 96, True), (16, 56, 5, 1, 18, 64, True), (56, 24, 3, 1, 22, 48, False),
)
# The directory that holds this package, put first on the probe's path: the probe imports this copy of it
# wherever it was imported from (a checkout, an editable install).
_ROOT = str(Path(__file__).resolve().parents[2])


def run_probe(name: str, spec: dict[str, Any], *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run ``python -m optuna_memprune.estimate.probes.<name> SPEC`` and return its result.

    The environment is this process's (the same allocator and threading settings the trials will see); the
    working directory a fresh empty one. Raises CalibrationError with the probe's last lines when it fails.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="memprune-probe-") as tmp:
        try:
            proc = subprocess.run([sys.executable, "-m", f"{__package__}.probes.{name}", json.dumps(spec)],
                                  capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired as exc:
            raise CalibrationError(f"calibration probe {spec} timed out after {timeout:.0f} s") from exc
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
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

    @classmethod
    def from_raw(cls, imports: tuple[str, ...], train: bool, raw: dict[str, Any]) -> StackBaseline:
        """The baseline from the stack probe's results, one per torch thread count (``raw["points"]``)."""
        points = raw["points"]
        first = points[0][1]
        t0, t1 = _fit([(n, p["warm"]["Threads"]) for n, p in points])
        _, r1 = _fit([(n, p["warm"]["VmHWM"]) for n, p in points])
        return cls(
            imports=imports, train=train, ram=first["warm"]["VmHWM"],
            threads_base=t0, threads_per_torch_thread=t1, ram_per_torch_thread=max(0, int(r1)),
            default_torch_threads=int(first.get("default_torch_threads", 1)),
        )


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

    @classmethod
    def from_raw(cls, env_id: str, atari: bool, frame_stack: int | None, raw: dict[str, Any]) -> EnvProfile:
        """The profile from the env probe's result."""
        one = raw["one"]["VmHWM"] - raw["before"]["VmHWM"]
        each = max(0, (raw["four"]["VmHWM"] - raw["one"]["VmHWM"]) // 3)
        sub = raw.get("subproc") or {"workers": [], "helpers": []}
        workers = sub["workers"] or [{"VmHWM": 0, "Threads": 0}]
        return cls(
            env_id=env_id, atari=atari, frame_stack=frame_stack,
            observation_space=raw["observation_space"], action_space=raw["action_space"],
            first_env_ram=max(one, each), env_ram=each,
            worker_ram=max(w["VmHWM"] for w in workers), worker_threads=max(w["Threads"] for w in workers),
            helper_ram=sum(h["VmHWM"] for h in sub["helpers"]),
            helper_threads=sum(h["Threads"] for h in sub["helpers"]),
            helper_processes=len(sub["helpers"]),
        )


@dataclass(frozen=True)
class CpuKernels:
    """What CPU kernels allocate outside torch's dispatcher on this host, as measured by the kernel probe.

    ``coefficients[i]`` multiplies the feature bytes of rule ``rules[i]`` (torchnet's ``WORKSPACE_RULES``:
    an operand's bytes with its channels padded to ``block``). ``measured`` is False where the probe could
    not measure (not glibc, no ``/proc/self/clear_refs``): the coefficients are then ``DEFAULT_KERNEL_COEF``.
    """

    rules: tuple[str, ...]
    coefficients: tuple[float, ...]
    block: int
    measured: bool = True

    def coefficient(self, rule: str) -> float:
        return self.coefficients[self.rules.index(rule)] if rule in self.rules else 0.0

    @classmethod
    def from_raw(cls, raw: dict[str, Any]) -> CpuKernels:
        """The coefficients from the kernel probe's result; the defaults where it reported an error."""
        if "error" in raw:
            return cls(rules=tuple(DEFAULT_KERNEL_COEF), coefficients=tuple(DEFAULT_KERNEL_COEF.values()),
                       block=0, measured=False)
        return cls(rules=tuple(raw["rules"]), coefficients=tuple(float(c) for c in raw["coef"]),
                   block=int(raw["block"]))


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope
