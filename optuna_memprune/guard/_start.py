"""The process's usage at the start of an in-process trial, and what earlier trials left in it.

In a shared process (``study.optimize(guard.wrap_objective(f))``) a trial's readings are the process's: they
include what earlier trials left behind (garbage not yet collected, free heap glibc keeps mapped, torch's
cached CUDA blocks, libraries an earlier trial imported). Before a trial's start level is read, what can be
given back is given back (``give_back``); ``ProcessLevels`` then reads the level and says how far
it stands above the first trial's start (what earlier trials left), and, once the process's first trial
returned, what it kept: its one-time costs (imports, a worker pool, a cache), not learned as its increment.

Owns the give-back (garbage collection, glibc ``malloc_trim``, torch's ``empty_cache`` where CUDA is
initialised), the levels of one guard's trials in this process, and the two rules on them, applied with the
policy's budget and soft line:

- ``charged``: admission compares usage now (all of it) plus the predicted increment with the soft line,
  where the prediction is an increment (a learned footprint). A footprint function predicts a whole process
  (the calibrated baseline included, which the first trial's start level already holds): it is compared
  alone, as in a fresh process.
- ``allowance``: a trial is never stopped or rejected for memory earlier trials left behind. Where what
  was left makes the budget unreachable (the start level plus the least a trial of this process needed to
  run to the end is over the soft line), the trial is held to its budget on its own memory instead: what
  was left is taken off what admission charges, and its soft line and budget are raised by it. The guard
  says so once and the record says so. ``set_aside`` does the same, where the budget is still reachable, for
  a checked trial that would not fit beside what was left (through ``charge``) and for a trial run unchecked.

Knows nothing of Optuna's trial machinery or the record's encoding.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import procfs
from ..monitor import auto_gpu_reader, read_tree
from ..units import format_bytes
from ._oom import cuda_reserved, empty_cuda_cache

if TYPE_CHECKING:
    from ..estimate.footprint import Footprint
    from ._policy import Policy
    from ._trials import TrialGuardState

LEVELS = ("ram", "vram", "threads")
#: A trial that ends holding less than this over its start level leaves too little to be worth a garbage
#: collection before the next start (94 ms with torch loaded); a trial of a few milliseconds pays none.
GIVE_BACK_ABOVE = 16 * 2**20
#: What earlier trials left counts only above this share of the budget: below it (4 KiB of heap between two
#: trials of a test study raised a trial's lines) it is noise, worth neither raised lines nor a warning.
LEFT_NOISE = 0.01


def give_back() -> None:
    """Give what the process holds but no longer uses back, in the order that frees most: collect garbage
    (arrays kept alive only by reference cycles, as Optuna's stored exception keeps a trial's frames), trim
    glibc's free heap (what collection freed included), then empty torch's CUDA cache where the program
    already runs torch on CUDA (torch is never imported for it).

    ``gc.collect()`` costs tens of milliseconds in a process that imported torch (94 ms measured here, with
    optuna and torch loaded, on a loaded 2-core machine): ``ProcessLevels`` calls this only before the
    first trial and after a trial that left something (``ProcessLevels.ended``).
    """
    gc.collect()
    trim_heap()
    empty_cuda_cache()


def trim_heap() -> None:
    """Give heap memory the process freed back to the OS (glibc ``malloc_trim(0)``); a no-op off glibc.

    glibc keeps freed heap blocks mapped (RSS) for reuse; without this a trial's level counts them.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc: present in the process's own symbols
    except (AttributeError, OSError):
        return None


_MALLOC_TRIM = _malloc_trim()


def reset_rss_peak() -> bool:
    """Reset this process's peak RSS (VmHWM, which ``peak_rss`` reads) to its RSS now, where Linux
    allows it (``procfs.reset_peak``): the peak a trial alone in the process reads at its end is then its
    own, even for a trial shorter than one monitor reading that stays under an earlier trial's peak (such
    trials had no peak, so no observation, and a learned guard's warm-up waited on them). Whether it was
    reset (a no-op elsewhere)."""
    try:
        procfs.reset_peak()
    except OSError:
        return False
    return True


def rss() -> int | None:
    """This process's RSS in bytes (one ``/proc/self/statm`` read), ``None`` where there is no /proc."""
    try:
        return int(procfs.read_own("statm").split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _level(extra_threads: int = 0) -> dict[str, int | None]:
    """This process's RSS, GPU memory (summed over GPUs, where NVML reads it) and threads (plus
    ``extra_threads``), with its child
    processes where its main thread has any (then read as the monitor reads the tree; a child started by
    another thread is left out of the fast read). One ``/proc/self/stat`` read in the usual case: a trial
    of a few milliseconds pays 0.03 ms for it, where the whole tree's read costs 0.46 ms (measured here)."""
    pid = os.getpid()
    try:
        kids = procfs.read_own(f"task/{pid}/children").split()
        fields = procfs.stat_fields(procfs.read_own("stat"))
    except OSError:  # no /proc (another OS): the portable reader
        kids, fields = [b"?"], []
    if kids:
        reading = read_tree(gpu="auto")
        return {"ram": reading.rss, "vram": reading.vram, "threads": reading.threads + extra_threads}
    gpu = auto_gpu_reader()
    return {
        "ram": int(fields[21]) * _PAGE,
        "vram": None if gpu is None else gpu.used_by({pid}),
        "threads": int(fields[17]) + extra_threads,
    }


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Start(NamedTuple):
    """A trial's start in a shared process: ``level`` (RSS, GPU memory summed over GPUs where read,
    threads; bytes and a count, ``None`` where not read), ``left`` (per resource, how far the process stood
    above the first trial's start, less the one-time costs that trial kept, the last time no trial ran in
    it: what earlier trials left behind; 0 when nothing), ``least`` (per resource, the smallest increment of
    a trial of this process that ran to the end; 0 before one did) and ``first`` (this level is the
    process's first: its baseline)."""

    level: dict[str, int | None]
    left: dict[str, int]
    least: dict[str, int]
    first: bool = False


class ProcessLevels:
    """The start levels of one guard's in-process trials, per process. Thread-safe.

    ``start`` gives back (the first time, and after a trial that ``ended`` holding more), then
    reads the process. The first level read is the process before any trial (its baseline); a level read
    while no other trial of the guard runs is the idle level, and what it stands above the baseline is what
    earlier trials left. A level read while other trials run counts their memory too, and is no idle level.

    Examples:
        >>> levels = ProcessLevels()
        >>> first = levels.start(alone=True)
        >>> first.level["ram"] > 0 and first.left == {"ram": 0, "threads": 0} and first.least == {}
        True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirty = True
        self._base: dict[str, int | None] | None = None
        self._idle: dict[str, int | None] | None = None
        self._least: dict[str, int] = {}
        self._kept: dict[str, int] = {}  # the first trial's one-time costs (``kept``): never counted as left

    def start(self, alone: bool, threads: int = 0) -> Start:
        """Give back what can be given back, read the process and say what earlier trials left; ``threads``
        are added to the threads read (threads that will run during the trial and do not yet)."""
        with self._lock:
            dirty, self._dirty = self._dirty, False
        if dirty:
            give_back()
        level = _level(threads)
        with self._lock:
            first = self._base is None
            if self._base is None:
                self._base = dict(level)
            if alone or self._idle is None:
                self._idle = dict(level) if alone else dict(self._base)
            base, idle, least, kept = self._base, self._idle, dict(self._least), dict(self._kept)
        left: dict[str, int] = {}
        for r in LEVELS:
            at_idle, at_base = idle[r], base[r]
            if at_idle is not None and at_base is not None:
                left[r] = max(0, at_idle - at_base - kept.get(r, 0))
        return Start(level, left, least, first)

    def kept(self, start: dict[str, int | None]) -> dict[str, int]:
        """What the process's first trial, which started at ``start``, keeps now that it ended: its one-time
        costs (libraries it imported, a worker pool or a cache it started, a CUDA context), which later trials
        find in the process and do not pay again. Where it holds more than ``GIVE_BACK_ABOVE`` over ``start``
        (or torch holds cached CUDA blocks), gives back first and reads RAM and GPU memory; none where it
        holds less; and the threads it started and left running. For a trial that returned: the objective's
        frames are gone, its garbage is collected here (a stopped one's may still be held by the exception on
        its way). Where it was a leak instead, the next trials show it in their own increments. What it keeps
        is no part of what later starts say earlier trials left (``Start.left``): a fresh process pays it too."""
        now, ram = _level(), start.get("ram")  # its child processes too (a pool's workers)
        threads, at_start = now["threads"], start.get("threads")  # a thread pool it started
        out = {} if threads is None or at_start is None or threads <= at_start else {"threads": threads - at_start}
        if now["ram"] is not None and ram is not None and (now["ram"] - ram > GIVE_BACK_ABOVE or cuda_reserved()):
            give_back()  # the next start gives back again: what the caller still holds is freed only after it
            now = _level()
            for r in ("ram", "vram"):
                at_end, at_start = now[r], start.get(r)
                if at_end is not None and at_start is not None and at_end > at_start:
                    out[r] = at_end - at_start
        with self._lock:
            self._kept = dict(out)
        return out

    def ended(self, start: dict[str, int | None] | None, own: dict[str, int] | None = None) -> None:
        """A trial that started at ``start`` (``start``'s level) ended; ``own``: its increments, where it
        ran to the end alone (the smallest become ``Start.least``). Where the process now holds more than
        ``GIVE_BACK_ABOVE`` over ``start``, or torch holds cached CUDA blocks, the next start gives back
        first: a trial that left nothing costs the next one no collection."""
        rss_now, level = rss(), (start or {}).get("ram")
        with self._lock:
            for r, v in (own or {}).items():
                self._least[r] = min(self._least.get(r, v), max(v, 0))
            if rss_now is None or level is None or rss_now - level > GIVE_BACK_ABOVE or cuda_reserved():
                self._dirty = True


def leftover(policy: Policy, start: Start) -> dict[str, int]:
    """What earlier trials left, per budgeted resource read at the start, where it is over ``LEFT_NOISE`` of
    the budget (below it is noise)."""
    return {
        r: left
        for r in policy.limits
        if (left := start.left.get(r, 0)) > LEFT_NOISE * getattr(policy.budget, r) and start.level.get(r) is not None
    }


def allowance(policy: Policy, start: Start) -> dict[str, int]:
    """What earlier trials left (``leftover``), per resource where it makes the budget unreachable: the start
    level plus ``start.least`` is over the soft line above that level (``Policy.line``: no trial that ran to
    the end here would fit beside it). Every trial starting there, one run unchecked included, has its soft
    line and budget raised by it and is not charged it (``charged``): it is held to its budget on its own
    memory, never stopped or rejected for what it found. Empty where the budget is still reachable; there
    a checked trial that would not fit beside what was left gets the same (``set_aside``)."""
    out = {}
    for r, left in leftover(policy, start).items():
        level = start.level[r] or 0  # read (``leftover``)
        line = policy.line({r: level})[r]  # the soft line above the usage a trial here would be charged
        if level + start.least.get(r, 0) > line:
            out[r] = left
    return out


def set_aside(state: TrialGuardState, why: str = "it would not fit beside it") -> bool:
    """Where a trial has no allowance yet and earlier trials left something (``state.left``): give it that
    allowance, so that it is checked without it and held to its budget on its own memory, never rejected,
    clamped or stopped for what it found; ``why`` are the record's words. Whether it did (the caller checks
    again). The guard does so for a checked trial over its soft line beside what was left (``charge``): one
    that fits beside it gets none, so its process stays under the budget. It does so for a trial run
    unchecked, which nothing shows to fit beside it (held to the whole budget instead, HF's second GPT-2 of a
    search started at 729 MiB, 297 MiB of them left by the first, and was stopped at 875 MiB of an 805 MiB
    budget, 146 MiB into its own), and for one a footprint function predicts, as a fresh process.

    Before, only ``allowance`` took what was left off, where it made the budget unreachable for the least
    trial run here: with 150 MiB left and 45 MiB of room, a trial predicted 60 MiB was rejected though it
    fits without it (``tests/guard/test_increments.py``), against "a trial is never rejected for memory that
    earlier trials left behind"."""
    if not state.left or state.allowance:
        return False
    state.allowance, state.aside = dict(state.left), why
    return True


def charged(policy: Policy, state: TrialGuardState) -> dict[str, int] | None:
    """What admission adds to a trial's prediction, per budgeted resource: in a shared process, where the
    prediction is an increment (``policy.increments``), the process's usage at the trial's start, less what
    ``allowance`` set aside. ``None`` where the trial has its own process (no start level) or where the
    prediction is a whole process's peak (a footprint function's)."""
    if state.start is None or not policy.increments:
        return None
    return {
        r: max(0, v - state.allowance.get(r, 0))
        for r, v in state.start.items()
        if v is not None and r in policy.budget.resources
    }


def charge(
    policy: Policy, state: TrialGuardState, assignment: dict[str, Any]
) -> tuple[dict[str, int] | None, Footprint]:
    """What admission charges a checked trial besides its prediction (``charged``), and the prediction of
    ``assignment`` above it; where the trial would not fit beside what earlier trials left, both without it
    (``set_aside``)."""
    base = charged(policy, state)
    footprint = policy.predict(assignment, base=base)
    if base is not None and policy.excess(footprint, base) and set_aside(state):
        base = charged(policy, state)
        footprint = policy.predict(assignment, base=base)
    return base, footprint


def describe_full(policy: Policy, start: Start) -> str | None:
    """Where the process, before its first trial, leaves a trial no room beyond noise (``LEFT_NOISE`` of the
    budget) under the soft line above it: the words of a warning. The budget counts all of a shared process,
    and a budget set from a program's runs elsewhere (its imports, data, Optuna's RDB storage) may sit at what
    the process holds: Lightning's process stood at 467.90 MiB of a 468 MiB budget, none of its 20 trials was
    feasible (10 rejected, 5 stopped, 5 over the line), and the program ended on Optuna's "No feasible
    trials" with nothing said of why."""
    if not start.first:
        return None
    parts = []
    for r, budget in policy.budget.resources.items():
        level = start.level.get(r)
        if level is None:
            continue
        room = policy.room({r: level})[r]  # under the soft line drawn above the level
        if room > LEFT_NOISE * budget:
            continue
        show = str if r == "threads" else format_bytes
        name = "threads" if r == "threads" else r.upper()
        parts.append(f"{name} {show(level)} of its {show(budget)} budget ({show(room)} of room)")
    if not parts:
        return None
    return (
        "The process holds " + ", ".join(parts) + " before its first trial (what the program loaded before the "
        "study: imports, data, the study's storage): trials that share the process have no room beside it, and "
        "one that takes more is rejected or stopped. Raise the budget above what the process holds plus what "
        "a trial needs."
    )


def describe_allowance(policy: Policy, state: TrialGuardState) -> str:
    """The words (warning and record) on a trial whose lines ``allowance`` or ``set_aside`` raised."""
    parts = []
    for r, left in state.allowance.items():
        show = str if r == "threads" else format_bytes
        level = (state.start or {}).get(r)
        at = str(level) if level is None else show(level)  # always read where something was left
        parts.append(
            f"{'threads' if r == 'threads' else r.upper()} {show(left)} left by earlier trials (the process at "
            f"{at} when it started; budget {show(getattr(policy.budget, r))} + {show(left)})"
        )
    why = state.aside or "it makes the budget unreachable"
    return (
        f"what earlier trials left is not charged to this trial ({why}): " + ", ".join(parts) + "; the trial is "
        "held to the budget on its own memory (its soft line and budget raised by that much); one process "
        "per trial keeps the process itself under the budget"
    )
