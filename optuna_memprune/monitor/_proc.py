"""Reads a process tree's RSS, peak RSS, PSS and threads: /proc directly on Linux, psutil elsewhere.

Knows nothing of Optuna, budgets, estimates or NVML (a GPU reader object is handed in by the caller).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from .. import procfs
from ..procfs import READ_SIZE, KiB, field, is_zombie, read_at, shares_parent_memory
from ..units import check_int
from ._nvml import resolve_gpu
from ._types import MonitorError, ProcessGone, Reading

if TYPE_CHECKING:
    from ._nvml import GpuSource

_logger = logging.getLogger("optuna_memprune.monitor")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# How often a full discovery (every thread's `children` file of every member) runs regardless, as a
# backstop for the cheap per-reading discovery (main thread's children + the pids created since the last
# pass, from /proc/loadavg). Seconds.
_SWEEP_EVERY_S = 2.0
# Below this many new pids since the last pass, checking each of them is cheaper than a full sweep.
_MIN_SCAN = 32
# The /proc backend needs /proc/<pid>/task/<tid>/children (Linux 3.5+, CONFIG_PROC_CHILDREN).
_HAS_PROC = sys.platform.startswith("linux") and os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


class ProcessTree(Protocol):
    """A reader of one process tree, as ``open_tree`` returns it (either backend)."""

    #: CPU seconds the last read of PSS took.
    pss_cost: float

    def read(self, *, pss: bool = False, gpu: GpuSource | None = None) -> Reading:
        """One pass over the tree; ProcessGone once its root has exited."""
        ...

    def processes(self) -> list[psutil.Process]:
        """psutil handles of the tree's live processes."""
        ...

    def close(self) -> None:
        """Release what the reader holds open."""
        ...


class _Member:
    """One process of the tree, held by open descriptors on its /proc directory.

    An open ``/proc/<pid>`` descriptor is bound to that process, not to the number: once the process is
    gone, reads through it fail with ESRCH even if the pid has been given to a new process. Identity is
    (pid, start), ``start`` being the start time in clock ticks since boot (``/proc/<pid>/stat`` field
    22, the figure psutil's ``create_time`` comes from).
    """

    __slots__ = ("pid", "start", "dfd", "status_fd", "children_fd", "proc")

    def __init__(self, pid: int, start: int, dfd: int, status_fd: int, children_fd: int) -> None:
        self.pid = pid
        self.start = start
        self.dfd = dfd
        self.status_fd = status_fd
        self.children_fd = children_fd  # the main thread's children, read every pass
        self.proc: psutil.Process | None = None

    def close(self) -> None:
        for fd in (self.children_fd, self.status_fd, self.dfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.children_fd = self.status_fd = self.dfd = -1


class _ProcTree:
    """Linux backend: descriptors kept open per process, one ``pread`` of ``status`` per process per pass.

    Discovery of new processes each pass: the ``children`` file of each member's main thread (where
    ``subprocess`` and ``multiprocessing`` usually fork from), plus every pid the kernel handed out since
    the last pass (``/proc/loadavg``'s last field), kept when it is a process whose parent is in the tree.
    Every ``_SWEEP_EVERY_S`` seconds, after a pid wrap-around, or when too many pids were handed out, a
    full sweep reads every thread's ``children`` file instead. psutil's ``children()`` scans every process
    of the system (about 1.7 ms a pass with 80 processes measured here), too slow for 10 Hz.

    Membership is sticky: a process that descended from the root stays in the tree until it exits, even
    when its parent exits first and it is re-parented to init.
    """

    def __init__(self, pid: int, *, sweep_every: float = _SWEEP_EVERY_S) -> None:
        self.root_pid = pid
        self._sweep_every = sweep_every
        self._next_sweep = 0.0
        self._members: dict[int, _Member] = {}
        self._threads: dict[int, int] = {}
        self._warned: set[int] = set()
        self.pss_cost = 0.0  # CPU seconds the last PSS read took (the kernel walks page tables: grows with RSS)
        try:
            self._loadavg_fd: int | None = os.open("/proc/loadavg", os.O_RDONLY)
        except OSError:
            self._loadavg_fd = None
        self._last_pid = self._read_last_pid()
        try:
            root = self._open_member(pid)
        except PermissionError as err:
            self.close()
            raise MonitorError(f"process {pid} may not be inspected: {err}") from None
        if root is None:
            self.close()
            raise ProcessGone(pid)
        self._members[pid] = root

    # -- discovery ---------------------------------------------------------------------------------
    def _read_last_pid(self) -> int | None:
        if self._loadavg_fd is None:
            return None
        try:
            return int(os.pread(self._loadavg_fd, 128, 0).split()[-1])
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _open_member(pid: int) -> _Member | None:
        """Open ``/proc/<pid>``; None when the process is gone. PermissionError propagates."""
        try:
            dfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None
        fds = [dfd]
        try:
            stat = read_at(dfd, "stat")
            fds.append(os.open("status", os.O_RDONLY, dir_fd=dfd))
            fds.append(os.open(f"task/{pid}/children", os.O_RDONLY, dir_fd=dfd))
        except BaseException as err:
            for fd in fds:
                os.close(fd)
            if isinstance(err, (FileNotFoundError, ProcessLookupError)):
                return None
            raise
        start = int(procfs.stat_fields(stat)[19])
        return _Member(pid, start, *fds)

    @staticmethod
    def _children_of(member: _Member, tid: int) -> list[int]:
        try:
            if tid == member.pid:
                return procfs.children(os.pread(member.children_fd, READ_SIZE, 0))
            return procfs.children(read_at(member.dfd, f"task/{tid}/children"))
        except OSError:  # thread or process gone
            return []

    def _sweep(self, member: _Member) -> list[int]:
        try:
            tfd = os.open("task", os.O_RDONLY | os.O_DIRECTORY, dir_fd=member.dfd)
        except OSError:
            return []
        try:
            tids = os.listdir(tfd)
        except OSError:
            return []
        finally:
            os.close(tfd)
        found = []
        for tid in tids:
            found.extend(self._children_of(member, int(tid)))
        return found

    @staticmethod
    def _scan_new(lo: int, hi: int, known: set[int]) -> set[int]:
        """Processes among pids ``lo..hi-1`` whose parent is in ``known`` (or among those found)."""
        parent_of: dict[int, int] = {}
        for pid in range(lo, hi):
            if pid in known:
                continue
            try:
                status = procfs.read(f"/proc/{pid}/status")
            except OSError:  # never used, already gone, or not ours to read
                continue
            if field(status, b"\nTgid:") == pid:  # a process, not a thread of one
                parent_of[pid] = field(status, b"\nPPid:")
        found: set[int] = set()
        grew = True
        while grew:
            grew = False
            for pid, ppid in parent_of.items():
                if pid not in found and (ppid in known or ppid in found):
                    found.add(pid)
                    grew = True
        return found

    def _discover(self, now: float) -> None:
        last, prev = self._read_last_pid(), self._last_pid
        members = list(self._members.values())
        found: set[int] = set()
        for m in members:
            found.update(self._children_of(m, m.pid))
        sweep = now >= self._next_sweep or prev is None or last is None
        if not sweep and last is not None and prev is not None and last != prev:
            n_new = last - prev
            sweep_cost = sum(2 + self._threads.get(m.pid, 1) for m in members)
            if 0 < n_new <= max(_MIN_SCAN, 2 * sweep_cost):
                found |= self._scan_new(prev + 1, last + 1, set(self._members) | found)
            else:  # wrapped around pid_max, or a burst of new pids
                sweep = True
        if sweep:
            for m in members:
                found.update(self._sweep(m))
            self._next_sweep = now + self._sweep_every
        self._last_pid = last
        for pid in sorted(found):
            if pid not in self._members:
                try:
                    new = self._open_member(pid)
                except OSError as err:  # EACCES under hidepid, EMFILE: the process stays out of the tree
                    if pid not in self._warned:
                        self._warned.add(pid)
                        _logger.warning("cannot watch process %d of the tree of %d: %s", pid, self.root_pid, err)
                    new = None
                if new is not None:
                    self._members[pid] = new

    # -- reading -----------------------------------------------------------------------------------
    def read(self, *, pss: bool = False, gpu: GpuSource | None = None) -> Reading:
        if not self._members:
            raise ProcessGone(self.root_pid, f"process {self.root_pid} is gone (tree closed)")
        t = time.monotonic()
        self._discover(t)
        threads = 0
        live: list[_Member] = []
        statuses: dict[int, bytes] = {}
        for pid, m in list(self._members.items()):
            try:
                status = os.pread(m.status_fd, READ_SIZE, 0)
            except OSError:
                status = b""
            if not status:  # exited and reaped
                if pid == self.root_pid:
                    raise ProcessGone(pid)
                m.close()
                del self._members[pid]
                self._threads.pop(pid, None)
                continue
            if is_zombie(status):
                if pid == self.root_pid:
                    raise ProcessGone(pid, f"process {pid} has exited (zombie, not yet reaped)")
                continue
            n = field(status, b"\nThreads:")
            self._threads[pid] = n
            threads += n
            statuses[pid] = status
            live.append(m)
        # A child between vfork() and exec (subprocess.Popen, posix_spawn) runs on its parent's memory, and its
        # status shows that memory: counted again, one reading of a tree whose process starts a command could
        # show twice its RSS (3-22% of the readings of a 200-330 MiB process running `true` in a loop) and stop a
        # trial above half its budget. Such a child is counted for its threads, not its memory.
        own = [m for m in live if not shares_parent_memory(statuses[m.pid], statuses)]
        rss = sum(field(statuses[m.pid], b"\nVmRSS:") for m in own)
        hwm = sum(field(statuses[m.pid], b"\nVmHWM:") for m in own)
        pss_total = None
        if pss:
            cpu = time.thread_time()
            pss_total = self._read_pss(own)
            self.pss_cost = time.thread_time() - cpu
        vram = gpu.used_by({m.pid for m in live}) if gpu is not None else None
        return Reading(t, rss * KiB, hwm * KiB, threads, len(live), pss_total, vram)

    @staticmethod
    def _read_pss(members: list[_Member]) -> int | None:
        total, readable = 0, False
        for m in members:
            try:
                data = read_at(m.dfd, "smaps_rollup")
            except OSError:  # gone, kernel too old, or another user's process
                continue
            if data:
                total += field(data, b"\nPss:")
                readable = True
        return total * KiB if readable else None

    def processes(self) -> list[psutil.Process]:
        """psutil handles of the tree's processes, made once per (pid, start) and checked against it."""
        out = []
        for m in list(self._members.values()):
            if m.proc is None:
                try:
                    proc = psutil.Process(m.pid)
                    # psutil's create_time is start/CLOCK_TICKS + boot time: the same start or another process.
                    if abs(proc.create_time() - psutil.boot_time() - m.start / _CLOCK_TICKS) > 1.0 / _CLOCK_TICKS:
                        continue
                except psutil.Error:
                    continue
                m.proc = proc
            out.append(m.proc)
        return out

    def close(self) -> None:
        for m in self._members.values():
            m.close()
        self._members.clear()
        if self._loadavg_fd is not None:
            os.close(self._loadavg_fd)
            self._loadavg_fd = None


class _PsutilTree:
    """Portable backend through psutil (any OS psutil supports; Linux uses ``_ProcTree``).

    Slower (``children()`` scans every process of the system each pass). ``hwm`` is the OS's peak where
    psutil gives one (Windows ``peak_wset``), else the highest RSS this reader has seen: a sampled lower
    bound, not the exact peak. ``pss`` exists only where psutil's ``memory_full_info`` has it (Linux).
    """

    def __init__(self, pid: int) -> None:
        self.root_pid = pid
        try:
            root = psutil.Process(pid)
            key = (pid, root.create_time())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(pid) from None
        except psutil.AccessDenied as err:
            raise MonitorError(f"process {pid} may not be inspected: {err}") from None
        self._root = root
        self._members: dict[tuple[int, float], psutil.Process] = {key: root}
        self._peaks: dict[tuple[int, float], int] = {}
        self.pss_cost = 0.0  # not separated from the pass here: the whole pass's CPU time when PSS was read

    def read(self, *, pss: bool = False, gpu: GpuSource | None = None) -> Reading:
        t = time.monotonic()
        cpu = time.thread_time()
        try:
            if not self._root.is_running() or self._root.status() == psutil.STATUS_ZOMBIE:
                raise ProcessGone(self.root_pid)
            children = self._root.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(self.root_pid) from None
        except psutil.AccessDenied as err:
            raise MonitorError(f"process {self.root_pid} may not be inspected: {err}") from None
        for child in children:
            try:
                key = (child.pid, child.create_time())
            except psutil.Error:
                continue
            self._members.setdefault(key, child)
        rss = hwm = threads = pss_total = 0
        pss_read = False
        live: list[int] = []
        for key, proc in list(self._members.items()):
            try:
                if not proc.is_running():  # exited, or its pid now belongs to another process
                    raise psutil.NoSuchProcess(proc.pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    mem = proc.memory_info()
                    n = proc.num_threads()
            except psutil.NoSuchProcess:
                if proc is self._root:
                    raise ProcessGone(self.root_pid) from None
                del self._members[key]
                self._peaks.pop(key, None)
                continue
            except (psutil.ZombieProcess, psutil.AccessDenied):
                continue
            p = None
            if pss:
                try:
                    p = getattr(proc.memory_full_info(), "pss", None)  # Linux only
                except psutil.Error:
                    pass
            peak = getattr(mem, "peak_wset", None)
            if peak is None:
                peak = max(self._peaks.get(key, 0), mem.rss)
                self._peaks[key] = peak
            rss += mem.rss
            hwm += peak
            threads += n
            if p is not None:
                pss_total += p
                pss_read = True
            live.append(proc.pid)
        if pss:
            self.pss_cost = time.thread_time() - cpu
        vram = gpu.used_by(set(live)) if gpu is not None else None
        return Reading(t, rss, hwm, threads, len(live), pss_total if pss_read else None, vram)

    def processes(self) -> list[psutil.Process]:
        return [p for p in self._members.values() if p.is_running()]

    def close(self) -> None:
        self._members.clear()


def open_tree(pid: int | None = None, *, backend: str | None = None) -> ProcessTree:
    """Return a reader of the tree rooted at ``pid`` (this process when None); raises ``ProcessGone``.

    ``backend`` is ``"proc"`` (Linux) or ``"psutil"``; None picks ``"proc"`` where /proc has what it needs.
    """
    if pid is None:
        pid = os.getpid()
    check_int(pid, "pid", minimum=1)
    if backend is None:
        backend = "proc" if _HAS_PROC else "psutil"
    if backend == "proc":
        return _ProcTree(pid)
    if backend == "psutil":
        return _PsutilTree(pid)
    raise ValueError(f"backend must be 'proc', 'psutil' or None, but got {backend!r}.")


def read_tree(pid: int | None = None, *, pss: bool = False, gpu: Any = None) -> Reading:
    """Read the memory and threads of the process tree rooted at ``pid`` once.

    Args:
        pid: Root of the tree; None (default) is this process. The tree is the root and all its
            descendants; processes that exit during the pass are left out, never raised for.
        pss: Also sum PSS from ``/proc/<pid>/smaps_rollup``. Costly: the kernel walks the page tables, about
            2 ms per 100 MiB of RSS measured here (0.25 ms for a bare interpreter). Default False.
        gpu: ``None`` (default, no GPU reading), ``"auto"`` (this process's shared NVML reader, None when
            there is no GPU) or a ``GpuReader``.

    Raises:
        ProcessGone: The root process does not exist (or has exited and is a zombie).
        MonitorError: The root process may not be inspected.

    Examples:
        >>> r = read_tree()  # this Python process and its children
        >>> r.processes >= 1 and r.hwm >= r.rss > 0
        True
    """
    tree = open_tree(pid)
    try:
        return tree.read(pss=pss, gpu=resolve_gpu(gpu))
    finally:
        tree.close()
