"""Model of glibc's malloc heap: what it keeps resident beyond the live bytes of a timeline (CPU targets).

Owns glibc's mmap-threshold rules and the retention estimate, and replays timelines of byte sizes (the events
of ``allocator.replay``); must not know networks, traces or Optuna.

torch's CPU allocator is glibc malloc (c10 alloc_cpu: posix_memalign). Rules of glibc's malloc.c / mallopt(3):
a request of at least the mmap threshold gets its own mapping, returned to the OS at free; a smaller one is
carved from the heap, whose freed chunks stay resident. The threshold starts at 128 KiB and is dynamic:
freeing a mapped chunk larger than it (up to 32 MiB on 64-bit) raises it to that chunk's size. So after
the first step, every transient storage smaller than the largest freed one lives on the heap.

Known limitations:
    - glibc's malloc with its default dynamic mmap threshold (or ``MALLOC_MMAP_THRESHOLD_`` as set in this
      process's environment) is assumed; a preloaded jemalloc or tcmalloc behaves otherwise.
    - Under the default, peak RSS of identical runs differs by up to +-30% and creeps up over the first
      hundreds of steps: ``RETENTION`` is a median, the spread is left to the learned margin.

Examples:
    >>> high_water([(0, 1000), (0, -1), (1, 2000)], threshold=(128 * 1024, True))
    2016
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["STEPS", "RETENTION", "mmap_threshold", "high_water", "retained"]

_MMAP_THRESHOLD = 128 * 1024  # DEFAULT_MMAP_THRESHOLD_MIN
_MMAP_THRESHOLD_MAX = 32 * 1024**2  # DEFAULT_MMAP_THRESHOLD_MAX (64-bit)
_CHUNK_OVERHEAD = 16  # chunk header (SIZE_SZ) and 16-byte alignment
_PAGE = 4096
# Steps to replay: the first raises the threshold, the next ones run on the heap as a long training does.
STEPS = 3
# What the heap keeps resident above the step's live bytes, as a multiple of the high-water of live heap
# storages (those below the threshold). Measured on this kind of host (glibc 2.36, torch 2.13, 1-2 threads):
# VmHWM of real CPU training (MLPs, CNNs, NatureCNN, batch 32-4096, 20-300 steps) minus the traced tensor and
# kernel-workspace peak is 0.3x to 2.5x that high-water, median about 1x, and varies by +-30% between
# identical runs (small allocations split freed chunks, so a same-size request cannot reuse them). The
# median is the estimate; the spread is left to the learned margin. With a fixed threshold
# (``MALLOC_MMAP_THRESHOLD_`` set) nothing large is retained and the traced peak is what the process keeps.
RETENTION = 1.0


def mmap_threshold() -> tuple[int, bool]:
    """(initial threshold, dynamic) as the trial's glibc will have them, read from this process's environment.

    ``MALLOC_MMAP_THRESHOLD_`` or the tunable ``glibc.malloc.mmap_threshold`` fix the threshold (mallopt(3)).
    """
    fixed = os.environ.get("MALLOC_MMAP_THRESHOLD_", "")
    for tunable in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = tunable.partition("=")
        if name == "glibc.malloc.mmap_threshold":
            fixed = value
    if fixed.isdigit():
        return int(fixed), False
    return _MMAP_THRESHOLD, True


def high_water(events: Iterable[tuple[int, int]], *, threshold: tuple[int, bool] | None = None) -> int:
    """High-water of live heap bytes (chunks below glibc's mmap threshold) over a timeline.

    ``events`` are ``(handle, nbytes)``: an allocation of ``nbytes > 0``, a free when ``nbytes < 0`` (as
    ``allocator.replay`` takes them; ``nbytes == 0`` is ignored). ``threshold`` is ``(initial, dynamic)``, by
    default ``mmap_threshold()``.
    """
    threshold_now, dynamic = mmap_threshold() if threshold is None else threshold
    heap = high = 0
    live: dict[int, tuple[int, bool]] = {}
    for handle, nbytes in events:
        if nbytes > 0:
            chunk = nbytes + _CHUNK_OVERHEAD
            mapped = chunk >= threshold_now
            live[handle] = (chunk, mapped)
            if not mapped:
                heap += chunk
                high = max(high, heap)
        elif nbytes < 0 and handle in live:
            chunk, mapped = live.pop(handle)
            if not mapped:
                heap -= chunk
            elif dynamic:
                pages = -(-chunk // _PAGE) * _PAGE
                if threshold_now < pages <= _MMAP_THRESHOLD_MAX:
                    threshold_now = pages
    return high


def retained(events: Iterable[tuple[int, int]]) -> int:
    """Bytes the heap keeps resident above the live bytes after a timeline of ``STEPS`` repeated steps:
    ``RETENTION`` times its ``high_water`` under this process's threshold."""
    return int(RETENTION * high_water(events))
