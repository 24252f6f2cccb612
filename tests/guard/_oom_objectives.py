"""Objectives that run out of memory, for the runner's tests: module-level, so they pickle into the children.

Trial 0 (``oom=True``) runs out of memory for real; the others hold a few MiB and complete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import optuna

MiB = 2**20


def footprint(params: dict) -> "object":
    """The child's baseline and a few MiB: every trial is admitted."""
    import optuna_memprune as omp

    return omp.Footprint.of(ram=300 * MiB)


def numpy_oom(trial: optuna.Trial) -> float:
    """numpy's real "Unable to allocate 1.00 PiB ..." (an ``_ArrayMemoryError``, a ``MemoryError``)."""
    if trial.suggest_categorical("oom", [True, False]):
        np.empty(1 << 50, dtype=np.uint8)
    return float(np.ones(4 * MiB, dtype=np.uint8).sum())


def torch_oom(trial: optuna.Trial) -> float:
    """torch's real ``OutOfMemoryError``, raised as its CUDA allocator raises it (no GPU here)."""
    import torch

    if trial.suggest_categorical("oom", [True, False]):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 7.79 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this "
            "process has 6.75 GiB memory in use."
        )
    return 1.0


def cgroup_oom(trial: optuna.Trial) -> float:
    """Joins the memory cgroup named by $MEMPRUNE_TEST_CGROUP (a test-made group with a small limit) and
    allocates past its limit: the kernel's OOM killer SIGKILLs this process."""
    if trial.suggest_categorical("oom", [True, False]):
        with open(os.path.join(os.environ["MEMPRUNE_TEST_CGROUP"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        held = np.ones(300 * MiB, dtype=np.uint8)  # the group holds 64 MiB
        return float(held[::4096].sum())
    return 1.0


_ELSEWHERE = (
    "import os, sys\n"
    "with open(os.path.join(sys.argv[1], 'cgroup.procs'), 'w') as f: f.write(str(os.getpid()))\n"
    "import numpy as np\n"
    "np.ones(300 << 20, dtype=np.uint8)\n"
)


def oom_elsewhere_then_killed(trial: optuna.Trial) -> float:
    """Has another process, in the test-made group of $MEMPRUNE_TEST_CGROUP, killed by the kernel's OOM
    killer (the host's OOM-kill count rises), then this process is SIGKILLed from outside: not out of memory."""
    if trial.suggest_categorical("oom", [True, False]):
        subprocess.run([sys.executable, "-c", _ELSEWHERE, os.environ["MEMPRUNE_TEST_CGROUP"]], check=False)
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0
