"""This process's own peak RSS, as the kernel counts it: read by the in-process objective and by a trial's
child process.

Owns where it is read and the unit conversion per platform; knows nothing of trials, budgets or monitors.
"""

from __future__ import annotations

import sys

from .. import procfs

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]


def peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` where /proc has it, else ``getrusage``'s ``ru_maxrss`` (KiB
    on Linux, bytes on macOS); 0 elsewhere.

    Not ``ru_maxrss`` on Linux: it is at least the ``VmHWM`` the process had before its ``exec`` (the parent's
    image it was forked from), which ``clear_refs`` does not reset. A program ``memprune run`` started from
    a 558 MiB test process read 558 MiB as the peak of every trial (``VmHWM``: 14 MiB after the reset).
    """
    try:
        kib = procfs.field(procfs.read_own("status"), b"\nVmHWM:")
    except OSError:
        kib = 0
    if kib:
        return kib * 1024
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
