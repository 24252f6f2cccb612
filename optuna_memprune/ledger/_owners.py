"""Whether the process that owns a reservation still runs: a pid together with its start time.

Owns the identity of a process (pid and psutil's ``create_time``, with a wall-clock step's tolerance); knows
nothing of the ledger's tables or of what a process reserved.
"""

from __future__ import annotations

import sys
from typing import Any

import psutil

from ..units import is_int

#: Two start times of one process agree within this (psutil's create_time has clock-tick resolution).
_START_TOLERANCE_S = 0.01
#: On Linux psutil's create_time is /proc/stat's btime (whole seconds, moved by a wall-clock step) plus the
#: start since boot; a whole-second difference up to this size is the same process after a clock step.
_CLOCK_STEP_S = 10


def owner_alive(pid: int, start: float) -> bool:
    """Whether the process ``(pid, start)`` still runs: the pid exists, is not a zombie and started at ``start``.

    A pid alone is not an identity: the kernel gives it to a new process after the owner exits, and the new
    one has another start time. ``start`` is psutil's ``create_time`` and must agree within 0.01 s; on
    Linux a difference of a whole number of seconds (up to 10) also agrees, since a wall-clock step moves
    the boot time psutil adds to every start.
    """
    try:
        proc = psutil.Process(pid)
        diff = proc.create_time() - start
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:  # it exists; we cannot look closer
        return True
    if abs(diff) <= _START_TOLERANCE_S:
        return True
    steps = round(diff)
    return sys.platform.startswith("linux") and abs(steps) <= _CLOCK_STEP_S and abs(diff - steps) <= _START_TOLERANCE_S


def start_of(pid: Any) -> float | None:
    """psutil's ``create_time`` of ``pid``, or None when there is no such process."""
    if not is_int(pid) or pid <= 0:
        return None
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
