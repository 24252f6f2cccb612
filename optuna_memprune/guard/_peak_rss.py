"""This process's own peak RSS, as the kernel counts it (``getrusage``): read by the in-process objective
and by a trial's child process.

Owns the unit conversion per platform; knows nothing of trials, budgets or monitors.
"""

from __future__ import annotations

import sys

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]


def peak_rss() -> int:
    """This process's peak RSS in bytes (``ru_maxrss`` is KiB on Linux, bytes on macOS); 0 elsewhere."""
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
