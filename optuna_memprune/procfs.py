"""The one reader of Linux's /proc: status and stat fields, children, descendants, the peak reset of a process,
the host's count of OOM kills.

Standard library only (calibration probes import it into bare interpreters); knows nothing of psutil or budgets.
"""

from __future__ import annotations

import os

KiB = 1024
#: Bytes read from a /proc file: ``status`` is about 1.4 KB, and the fields read come before its long masks.
READ_SIZE = 16384


def field(data: bytes, key: bytes) -> int:
    """Integer after ``key`` (``b"\\nVmRSS:"``) in a /proc key-value file; 0 when the key is absent."""
    i = data.find(key)
    if i < 0:
        return 0
    i += len(key)
    j = data.find(b"\n", i)
    return int(data[i:j].split()[0])


def read(path: str) -> bytes:
    """The first ``READ_SIZE`` bytes of a /proc file, in one read (/proc files are generated per read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, READ_SIZE)
    finally:
        os.close(fd)


_own: dict[str, int] = {}  # descriptors of this process's own files, by name (``read_own``, ``reset_peak``)


def _kept(name: str, flags: int) -> int:
    """The kept descriptor of ``/proc/<this process>/<name>``, opened on first use."""
    fd = _own.get(name)
    if fd is None:
        opened = os.open(f"/proc/{os.getpid()}/{name}", flags)
        fd = _own.setdefault(name, opened)  # one kept where two threads opened it at once
        if fd != opened:
            os.close(opened)
    return fd


def _forget(name: str, fd: int) -> None:
    """A kept descriptor failed: closed under it (a program closing every descriptor); opened again next time."""
    if _own.get(name) == fd:
        del _own[name]


def read_own(name: str) -> bytes:
    """``read`` of ``/proc/<this process>/<name>`` (``stat``, ``statm``, ``task/<pid>/children``) from a
    descriptor kept open: one ``pread`` (each read generates the file afresh), 1-3 us a read against 4-7 us to
    open, read and close it here, and more after other work evicted the path's lookup from the caches. A
    forked child opens its own."""
    fd = _kept(name, os.O_RDONLY)
    try:
        return os.pread(fd, READ_SIZE, 0)
    except OSError:
        _forget(name, fd)
        raise


def _forget_own() -> None:
    """In a forked child: the parent's descriptors read the parent's files."""
    for fd in _own.values():
        os.close(fd)
    _own.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_own)


def read_at(dfd: int, name: str) -> bytes:
    """``read`` of ``name`` relative to an open ``/proc/<pid>`` directory descriptor (bound to that process)."""
    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    try:
        return os.read(fd, READ_SIZE)
    finally:
        os.close(fd)


def is_zombie(status: bytes) -> bool:
    """Whether a ``status`` file's State is Z (zombie) or X (dead)."""
    i = status.find(b"\nState:")
    return i >= 0 and status[i + 7 : i + 10].strip()[:1] in (b"Z", b"X")


_SIZES, _RESIDENT = (b"\nVmPeak:", b"\nVmSize:"), (b"\nVmHWM:", b"\nVmRSS:")
_RESIDENT_SLACK_KIB = 1024  # pages the child touches between the two reads (its stack): 4 KiB were seen


def shares_parent_memory(status: bytes, statuses: dict[int, bytes]) -> bool:
    """Whether the process whose ``status`` this is shows its parent's memory as its own, as a child does
    between vfork() and exec: its parent, read in the same pass, waits uninterruptibly (state D, as vfork's
    parent does until the child execs), their address spaces have the same peak and present size, and their
    peak and present RSS are the same but for the pages the child touched between the two reads. A child
    forked without vfork starts with its own peaks (its size when it was made), which differ from a parent
    that ever shrank, and its parent does not wait."""
    parent = statuses.get(field(status, b"\nPPid:"))
    if parent is None or b"\nState:\tD" not in parent:
        return False
    return all(field(status, k) == field(parent, k) for k in _SIZES) and all(
        abs(field(status, k) - field(parent, k)) <= _RESIDENT_SLACK_KIB for k in _RESIDENT
    )


def stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a ``stat`` file after the command name: index 0 is field 3 (state), 1 the parent pid,
    19 the start time in clock ticks since boot (field 22). The name may hold spaces and parentheses."""
    return stat[stat.rfind(b")") + 2 :].split()


def children(data: bytes) -> list[int]:
    """The pids in a ``task/<tid>/children`` file."""
    return [int(c) for c in data.split()]


def status(pid: int | str = "self") -> dict[str, int] | None:
    """``VmHWM`` and ``VmRSS`` in bytes and ``Threads`` of a process, as far as its status file has them;
    None when it cannot be read (gone, or not ours)."""
    try:
        data = read(f"/proc/{pid}/status")
    except OSError:
        return None
    return _status_fields(data)


def own_status() -> dict[str, int]:
    """``status()`` of this process, which can always read its own; OSError where there is no /proc."""
    return _status_fields(read("/proc/self/status"))


def _status_fields(data: bytes) -> dict[str, int]:
    out = {}
    for name, scale in (("VmHWM", KiB), ("VmRSS", KiB), ("Threads", 1)):
        key = f"\n{name}:".encode()
        if key in data:
            out[name] = field(data, key) * scale
    return out


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, ...), from one pass over every ``stat``."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(stat_fields(read(f"/proc/{name}/stat"))[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def reset_peak() -> None:
    """Reset this process's VmHWM to its present RSS (``clear_refs`` 5, Linux >= 4.0; a kept descriptor);
    OSError where not. ``getrusage``'s ``ru_maxrss`` follows it only down to what the process held before its
    ``exec``."""
    fd = _kept("clear_refs", os.O_WRONLY)
    try:
        os.write(fd, b"5")
    except OSError:
        _forget("clear_refs", fd)
        raise


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (``oom_kill`` in /proc/vmstat, Linux
    >= 4.13): one count for the whole host, kills at a cgroup's limit included. None where it cannot be read.

    Examples:
        >>> before = oom_kills()
        >>> before is None or before >= 0
        True
    """
    try:
        data = read("/proc/vmstat")
    except OSError:
        return None
    key = b"\noom_kill "
    return field(data, key) if key in data else None
