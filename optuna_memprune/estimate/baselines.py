"""What the calibration probes measure, as values (StackBaseline, EnvProfile, CpuKernels), and how a probe runs.

Knows nothing of the cache file, of Footprints, or of what a probe does inside its interpreter.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..exceptions import CalibrationError
from .probes import MARK

#: Torch thread counts at which the stack probe measures the process (a line is fitted through them).
THREAD_POINTS = (1, 4)
PROBE_TIMEOUT_S = 120
# Where the kernel probe cannot measure: its fit on the development host (AVX-512 EPYC, glibc 2.36, torch
# 2.13 with oneDNN 3.12), per torchnet.WORKSPACE_RULES.
DEFAULT_KERNEL_COEF = {
    "conv_fwd_in": 0.44,
    "conv_fwd_out": 0.80,
    "conv_bwd_in": 1.0,
    "conv_bwd_out": 0.80,
    "conv_bwd_grad_in": 0.15,
}
#: Reference convolutions of the kernel probe: (in channels, out channels, kernel, stride, height = width,
#: batch, input gradient). Odd sizes on purpose, none of them a layer of the benchmark's or SB3's networks.
KERNEL_CONVS = (
    (5, 24, 5, 2, 50, 64, False),
    (12, 20, 3, 1, 30, 64, True),
    (24, 40, 3, 1, 24, 64, True),
    (40, 80, 3, 2, 26, 64, True),
    (48, 48, 3, 1, 20, 64, True),
    (80, 96, 1, 1, 14, 64, True),
    (96, 48, 3, 1, 10, 96, True),
    (16, 56, 5, 1, 18, 64, True),
    (56, 24, 3, 1, 22, 48, False),
)
# The directory that holds this package, put first on the probe's path: the probe imports this copy of it
# wherever it was imported from (a checkout, an editable install).
_ROOT = str(Path(__file__).resolve().parents[2])


def run_probe(name: str, spec: dict[str, Any], *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run ``python -m optuna_memprune.estimate.probes.<name> SPEC`` and return its result (``run_probes``)."""
    return run_probes(name, [spec], timeout=timeout)[0]


def run_probes(name: str, specs: Sequence[dict[str, Any]], *, timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """Run the probe ``name`` once per spec, all at the same time, and return their results in order.

    Each probe is ``python -m optuna_memprune.estimate.probes.<name> SPEC`` in a fresh interpreter with this
    process's environment (the same allocator and threading settings the trials will see), a fresh empty
    working directory, and a session of its own. Whatever stops the wait (Ctrl-C, a signal turned into an
    exception, a timeout) kills every probe and its children first: none outlives the call. Raises
    CalibrationError with the probe's last lines when one fails.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="memprune-probe-") as tmp:
        procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            with _sigint_deferred():  # a Ctrl-C inside Popen would leave a started probe unrecorded, unkilled
                for i, spec in enumerate(specs):
                    out = Path(tmp, f"out{i}")
                    with out.open("w") as f:  # a file, not a pipe: a chatty probe never blocks on a full pipe
                        procs.append(
                            (
                                subprocess.Popen(
                                    [sys.executable, "-m", f"{__package__}.probes.{name}", json.dumps(spec)],
                                    stdout=f,
                                    stderr=subprocess.STDOUT,
                                    env=env,
                                    cwd=tmp,
                                    start_new_session=True,
                                ),
                                out,
                            )
                        )
            results = []
            for (proc, out), spec in zip(procs, specs, strict=False):
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise CalibrationError(f"calibration probe {spec} timed out after {timeout:.0f} s") from None
                results.append(_result(spec, proc.returncode, out.read_text(errors="replace")))
            return results
        finally:
            for proc, _ in procs:
                _kill(proc)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a SIGINT that lands inside the block and raise its KeyboardInterrupt when the block ends (only in
    the main thread, where Python delivers signals, and only over Python's default handler)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a probe's session (the probe and what it started: env workers, forkserver) unless it has ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _result(spec: dict[str, Any], returncode: int, output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK) :])
            return result
    tail = output.strip().splitlines()[-5:]
    raise CalibrationError(f"calibration probe {spec} failed (exit {returncode}): " + " | ".join(tail))


@dataclass(frozen=True)
class StackBaseline:
    """What a process that imported ``imports`` (and ran one tiny training step if ``train``) costs.

    All numbers are bytes except thread counts. ``threads_at(n)`` and ``thread_ram`` come from a line fitted
    through measurements at several torch thread counts.
    """

    imports: tuple[str, ...]
    train: bool
    ram: int  # VmHWM after imports (+ warm-up step), torch at 1 thread
    threads_base: float  # fitted thread count at 0 torch threads (intercept)
    threads_per_torch_thread: float
    ram_per_torch_thread: int
    default_torch_threads: int
    measured_at: float | None = field(default=None, compare=False)  # wall clock (epoch s); None: older cache
    checked_at: float | None = field(default=None, compare=False)  # its last recheck within tolerance

    def threads_at(self, torch_threads: int) -> int:
        return int(round(self.threads_base + self.threads_per_torch_thread * torch_threads))

    @classmethod
    def from_raw(cls, imports: tuple[str, ...], train: bool, raw: dict[str, Any]) -> StackBaseline:
        """The baseline from the stack probe's results, one per torch thread count (``raw["points"]``).

        Raises ValueError naming the field when ``raw`` is not what the probe writes (a hand-edited cache)."""
        n_points = len(_at(raw, "points", kind=list))
        if not n_points:
            raise ValueError("points is empty")
        points = [
            (
                _at(raw, "points", i, 0),
                _at(raw, "points", i, 1, "warm", "Threads"),
                _at(raw, "points", i, 1, "warm", "VmHWM"),
            )
            for i in range(n_points)
        ]
        first = _at(raw, "points", 0, 1, kind=dict)
        t0, t1 = _fit([(n, threads) for n, threads, _ in points])
        _, r1 = _fit([(n, hwm) for n, _, hwm in points])
        default = _at(first, "default_torch_threads") if "default_torch_threads" in first else 1
        return cls(
            imports=imports,
            train=train,
            ram=points[0][2],
            threads_base=t0,
            threads_per_torch_thread=t1,
            ram_per_torch_thread=max(0, int(r1)),
            default_torch_threads=max(1, default),
            measured_at=_at(raw, "measured_at", kind=float) if "measured_at" in raw else None,
            checked_at=_at(raw, "checked", "at", kind=float) if "checked" in raw else None,
        )


@dataclass(frozen=True)
class EnvProfile:
    """An environment as SB3 builds it: its spaces, the RSS of one instance, one SubprocVecEnv worker."""

    env_id: str
    atari: bool
    frame_stack: int | None
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    first_env_ram: int  # the first instance in a process (lazy module state, ROM load)
    env_ram: int  # each further instance in the same process
    worker_ram: int = 0  # VmHWM of one SubprocVecEnv worker process
    worker_threads: int = 0
    helper_ram: int = 0  # forkserver and resource tracker, once per process tree
    helper_threads: int = 0
    helper_processes: int = 0
    measured_at: float | None = field(default=None, compare=False)  # wall clock (epoch s); None: older cache

    @classmethod
    def from_raw(cls, env_id: str, atari: bool, frame_stack: int | None, raw: dict[str, Any]) -> EnvProfile:
        """The profile from the env probe's result (ValueError naming the field where it is not one)."""
        _at(raw, kind=dict)
        one = _at(raw, "one", "VmHWM") - _at(raw, "before", "VmHWM")
        each = max(0, (_at(raw, "four", "VmHWM") - _at(raw, "one", "VmHWM")) // 3)
        sub = raw.get("subproc") or {"workers": [], "helpers": []}
        workers = [
            (_at(sub, "workers", i, "VmHWM"), _at(sub, "workers", i, "Threads"))
            for i in range(len(_at(sub, "workers", kind=list)))
        ] or [(0, 0)]
        helpers = [
            (_at(sub, "helpers", i, "VmHWM"), _at(sub, "helpers", i, "Threads"))
            for i in range(len(_at(sub, "helpers", kind=list)))
        ]
        return cls(
            env_id=env_id,
            atari=atari,
            frame_stack=frame_stack,
            observation_space=_space(raw, "observation_space"),
            action_space=_space(raw, "action_space"),
            first_env_ram=max(one, each),
            env_ram=each,
            worker_ram=max(w[0] for w in workers),
            worker_threads=max(w[1] for w in workers),
            helper_ram=sum(h[0] for h in helpers),
            helper_threads=sum(h[1] for h in helpers),
            helper_processes=len(helpers),
            measured_at=_at(raw, "measured_at", kind=float) if "measured_at" in raw else None,
        )


@dataclass(frozen=True)
class CudaCosts:
    """What a CUDA process holds besides its tensors on this host's GPU, as the cuda probe measured it.

    ``context``: NVML's per-process figure less torch's reserved bytes, after a first matmul, convolution,
    attention and Adam step (driver context, loaded modules, cuDNN/cuBLAS handles); ``cublas_workspace``:
    what stays allocated through the caching allocator after the first matmuls (cuBLAS and cuBLASLt
    workspaces). ``measured`` is False where the probe could not measure (then ``error`` says why) and the
    figures are the allocator model's defaults.
    """

    context: int
    cublas_workspace: int
    gpu: str = ""
    measured: bool = True
    error: str = ""

    @classmethod
    def default(cls, error: str = "") -> CudaCosts:
        from .allocator import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES

        return cls(CUDA_CONTEXT_BYTES, CUBLAS_WORKSPACE_BYTES, measured=False, error=error)

    @classmethod
    def from_raw(cls, raw: dict[str, Any]) -> CudaCosts:
        """The figures of the probe's result; the defaults where it reported an error."""
        if "error" in _at(raw, kind=dict):
            return cls.default(str(raw["error"]))
        return cls(_at(raw, "context"), _at(raw, "cublas_workspace"), gpu=_at(raw, "gpu", kind=str))


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
        if "error" in _at(raw, kind=dict):
            return cls(
                rules=tuple(DEFAULT_KERNEL_COEF),
                coefficients=tuple(DEFAULT_KERNEL_COEF.values()),
                block=0,
                measured=False,
            )
        n = len(_at(raw, "rules", kind=list))
        if len(_at(raw, "coef", kind=list)) != n:
            raise ValueError(f"coef has {len(raw['coef'])} values for {n} rules")
        return cls(
            rules=tuple(_at(raw, "rules", i, kind=str) for i in range(n)),
            coefficients=tuple(float(_at(raw, "coef", i, kind=float)) for i in range(n)),
            block=_at(raw, "block"),
        )


def _at(raw: Any, *path: str | int, kind: type = int) -> Any:
    """``raw[path[0]][path[1]]...`` if it is a ``kind`` (an int: not a bool, not negative; a float: any finite
    number), else ValueError naming the path: a cache entry edited by hand or by another version fails here,
    as one error, and never later inside an estimate."""
    value = raw
    for i, key in enumerate(path):
        if (
            isinstance(key, int)
            and not (isinstance(value, list) and 0 <= key < len(value))
            or isinstance(key, str)
            and not (isinstance(value, dict) and key in value)
        ):
            raise ValueError(f"no {'/'.join(map(str, path[: i + 1]))}")
        value = value[key]
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, kind)
    if not ok:
        expected = {int: "a non-negative int", float: "a number", dict: "an object"}.get(kind, f"a {kind.__name__}")
        raise ValueError(f"{'/'.join(map(str, path)) or 'the entry'} is {value!r}, not {expected}")
    return value


def _space(raw: Any, name: str) -> dict[str, Any]:
    """A space as the env probe describes it (``probes.env.describe``): a type, a shape of ints, a dtype."""
    space: dict[str, Any] = _at(raw, name, kind=dict)
    _at(space, "type", kind=str)
    for i in range(len(_at(space, "shape", kind=list))):
        _at(space, "shape", i)
    if space.get("dtype") is not None:
        _at(space, "dtype", kind=str)
    return space


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope
