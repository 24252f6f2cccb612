"""Whether the process that owns a reservation still runs: a pid together with its start time.

Owns the identity of a process (pid and psutil's ``create_time``, with a wall-clock step's tolerance); knows
nothing of the ledger's tables or of what a process reserved. On Linux both are read from the process's
``/proc/<pid>/stat`` in one read, 17 us a check (psutil's ``Process`` read it twice and /proc/stat once: 190 us,
and a ledger transaction checks every owner on its host).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psutil

from .. import procfs
from ..units import is_int

#: Two start times of one process agree within this (psutil's create_time has clock-tick resolution).
_START_TOLERANCE_S = 0.01
#: On Linux psutil's create_time is /proc/stat's btime (whole seconds, moved by a wall-clock step) plus the
#: start since boot; a whole-second difference up to this size is the same process after a clock step.
_CLOCK_STEP_S = 10
_LINUX = sys.platform.startswith("linux") and os.path.isfile("/proc/self/stat")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if _LINUX else 100
#: /proc/stat's btime, read again after this long (a wall-clock step moves it; see ``_CLOCK_STEP_S``).
_BOOT_TIME_KEPT_S = 1.0
_boot: list[float] = []  # [read at (monotonic), btime]


def _boot_time() -> float:
    """/proc/stat's ``btime`` (what psutil adds to every start), read at most once a ``_BOOT_TIME_KEPT_S``."""
    now = time.monotonic()
    if not _boot or now - _boot[0] > _BOOT_TIME_KEPT_S:
        data = procfs.read("/proc/stat")
        i = data.index(b"\nbtime ") + 7
        _boot[:] = [now, float(data[i : data.index(b"\n", i)])]
    return _boot[1]


def _identity(pid: int) -> tuple[float, bool] | None:
    """psutil's ``create_time`` of ``pid`` and whether it is a zombie (or dead); None when there is no such
    process. On Linux from one read of its ``/proc/<pid>/stat``. Raises ``PermissionError`` or psutil's
    ``AccessDenied`` where the process is hidden from this one."""
    if not _LINUX:
        try:
            proc = psutil.Process(pid)
            return proc.create_time(), proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # ZombieProcess included
            return None
    try:
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return float(fields[19]) / _CLOCK_TICKS + _boot_time(), fields[0] in (b"Z", b"X")


def owner_alive(pid: int, start: float) -> bool:
    """Whether the process ``(pid, start)`` still runs: the pid exists, is not a zombie and started at ``start``.

    A pid alone is not an identity: the kernel gives it to a new process after the owner exits, and the new
    one has another start time. ``start`` is psutil's ``create_time`` and must agree within 0.01 s; on
    Linux a difference of a whole number of seconds (up to 10) also agrees, since a wall-clock step moves
    the boot time psutil adds to every start.
    """
    try:
        found = _identity(pid)
    except (psutil.AccessDenied, PermissionError):  # it exists; we cannot look closer
        return True
    if found is None or found[1]:
        return False
    diff = found[0] - start
    if abs(diff) <= _START_TOLERANCE_S:
        return True
    steps = round(diff)
    return sys.platform.startswith("linux") and abs(steps) <= _CLOCK_STEP_S and abs(diff - steps) <= _START_TOLERANCE_S


def start_of(pid: Any) -> float | None:
    """psutil's ``create_time`` of ``pid``, or None when there is no such process."""
    if not is_int(pid) or pid <= 0:
        return None
    try:
        found = _identity(pid)
    except (psutil.AccessDenied, PermissionError):
        return None
    return None if found is None else found[0]
