"""The plain data and errors of the monitor: Reading, MonitorError, ProcessGone.

Knows nothing of /proc, psutil or NVML (those are the backends' business), nor of Optuna or estimates.
"""

from __future__ import annotations

from typing import NamedTuple

from ..exceptions import MemPruneError


class Reading(NamedTuple):
    """One pass over a process tree. All numbers are bytes, except ``threads``, ``processes`` and ``t``.

    Attributes:
        t: ``time.monotonic()`` when the pass began.
        rss: Sum of the present resident set size (``VmRSS``) over the tree (root and descendants).
        hwm: Sum of each process's own peak RSS (``VmHWM`` in ``/proc/<pid>/status``). Exact per process
            (to a few pages: the kernel batches its RSS counters per CPU), but the peaks of different
            processes may lie at different times, so this is an upper bound of the tree's simultaneous peak.
            A process that exited before it was read is not in it.
        threads: Sum of the thread counts over the tree.
        processes: Number of live (not zombie) processes in the tree.
        pss: Sum of ``Pss`` from ``/proc/<pid>/smaps_rollup`` (shared pages divided fairly among the
            processes that map them) when asked for with ``pss=True``; ``None`` otherwise or where the OS
            has no such figure.
        vram: GPU memory used by the tree's pids, summed over GPUs, as NVML reports it; ``None`` when
            there is no GPU/NVML or no GPU reading was asked for.

    Note:
        RSS counts a page shared by two processes of the tree twice (fork copy-on-write pages, shared
        libraries); PSS does not, which is why a tree of forked workers may look bigger in ``rss`` than it
        is. A budget on ``rss`` is the conservative choice. A child between vfork() and exec (what
        ``subprocess.run`` and ``posix_spawn`` make) runs on its parent's memory and is counted in
        ``threads`` and ``processes`` only.
    """

    t: float
    rss: int
    hwm: int
    threads: int
    processes: int
    pss: int | None
    vram: int | None


class MonitorError(MemPruneError, RuntimeError):
    """A process tree could not be read (for example the root process may not be inspected)."""


class ProcessGone(MonitorError):
    """The root process of a monitored tree has exited (or is a zombie waiting to be reaped).

    Attributes:
        pid: The root's pid.
    """

    def __init__(self, pid: int, msg: str | None = None) -> None:
        self.pid = pid
        self.msg = msg if msg is not None else f"process {pid} is gone"
        super().__init__(self.msg)

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return (type(self), (self.pid, self.msg))
