"""Objectives for the runner's cgroup tests: module-level, so they pickle into the trials' processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import optuna

# The trial's child: starts a grandchild in a session of its own that ignores SIGTERM and writes
# "<pid> <start ticks>" to the marker file once it does, then exits at once (the parent dies first).
_CHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open("/proc/self/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {start}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
''', sys.argv[1]], start_new_session=True)
"""


def burst(trial: optuna.Trial, nbytes: int) -> float:
    """Touches ``nbytes`` at once (a zero-filled bytearray): far faster than the watchdog's poll."""
    trial.suggest_int("mb", 8, 16)
    block = bytearray(nbytes)
    return float(len(block))


def orphan(trial: optuna.Trial, marker: str) -> float:
    """Leaves a grandchild behind whose parent died first, then returns."""
    trial.suggest_int("mb", 8, 16)
    subprocess.run([sys.executable, "-c", _CHILD, marker], check=True)
    for _ in range(600):
        if os.path.exists(marker):
            break
        time.sleep(0.1)
    return 0.0


def write_file(trial: optuna.Trial, path: str, mib: int) -> float:
    """Writes ``mib`` MiB to a file, 1 MiB at a time: page cache charged to its group, little RSS."""
    trial.suggest_int("mb", 8, 16)
    chunk = b"x" * 2**20
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(chunk)
    return 0.0
