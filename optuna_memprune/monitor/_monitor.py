"""Monitor: a daemon thread that reads a process tree every `interval` and keeps peaks and a timeline.

Knows nothing of Optuna, budgets or what a reading means for a trial: callers act in `on_reading`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..units import check_int, check_number
from ._nvml import GpuSource, resolve_gpu
from ._proc import ProcessTree, open_tree
from ._types import ProcessGone, Reading

_logger = logging.getLogger("optuna_memprune.monitor")

# PSS costs a page-table walk per process (about 2 ms per 100 MiB of RSS measured here; seconds for tens of
# GiB), so the monitor refreshes it only as often as keeps that cost at this share of one core.
_PSS_CPU_SHARE = 0.01

Point = tuple[float, int, int, int | None]  # (t, rss, threads, vram): t in seconds, rss in bytes, vram in bytes or None


def _opt(values: Sequence[int | None], pick: Callable[..., int]) -> int | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def _max_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


def _merge_peak(peak: Reading | None, r: Reading) -> Reading:
    if peak is None:
        return r
    return Reading(
        t=r.t if r.rss > peak.rss else peak.t,
        rss=max(peak.rss, r.rss),
        hwm=max(peak.hwm, r.hwm),
        threads=max(peak.threads, r.threads),
        processes=max(peak.processes, r.processes),
        pss=_max_opt(peak.pss, r.pss),
        vram=_max_opt(peak.vram, r.vram),
    )


def downsample(points: Sequence[Point], max_points: int) -> list[Point]:
    """Reduce ``(t, rss, threads, vram)`` points to at most ``max_points``, keeping every column's extremes.

    The time span is cut into ``max_points // 2`` equal buckets; a bucket of several points becomes two,
    in time order: at the time of its lowest RSS the bucket's minimum of each column, at the time of its
    highest RSS the bucket's maximum of each column. So the maximum (and minimum) of rss, threads and vram
    over all points survives any number of downsamplings.
    """
    if len(points) <= max_points:
        return list(points)
    n_buckets = max(1, max_points // 2)
    t0, t1 = points[0][0], points[-1][0]
    span = t1 - t0
    buckets: list[list[Point]] = [[] for _ in range(n_buckets)]
    for i, p in enumerate(points):
        frac = (p[0] - t0) / span if span > 0 else i / len(points)
        buckets[min(int(frac * n_buckets), n_buckets - 1)].append(p)
    out: list[Point] = []
    for bucket in buckets:
        if len(bucket) == 1:
            out.append(bucket[0])
        elif bucket:
            lo = min(bucket, key=lambda p: p[1])
            hi = max(bucket, key=lambda p: p[1])
            low = (lo[0], lo[1], min(p[2] for p in bucket), _opt([p[3] for p in bucket], min))
            high = (hi[0], hi[1], max(p[2] for p in bucket), _opt([p[3] for p in bucket], max))
            out.extend((low, high) if lo[0] <= hi[0] else (high, low))
    return out


class Monitor:
    """Samples a process tree's memory and threads from a daemon thread.

    ``start()`` takes the first reading in the caller's thread (so a missing root raises
    ``ProcessGone`` there, and ``peak``/``latest`` are set on return), then a daemon thread reads
    every ``interval`` seconds and calls ``on_reading`` with each reading, the first included. When the
    root process exits the thread records it (``gone`` becomes True) and ends quietly.

    Args:
        pid: Root of the tree; None (default) is this process.
        interval: Seconds between readings, > 0. Default 0.1. A pass that overruns skips the missed ticks.
        pss: Also read PSS. Default False. Refreshed only as often as keeps its cost near 1% of one core
            (``_PSS_CPU_SHARE``): a PSS pass of 6 ms (a 200 MiB tree, measured here) is repeated every
            0.6 s; readings in between carry the last figure.
        gpu: ``"auto"`` (default: the process's shared NVML reader, none without a GPU), ``None`` (no GPU
            readings) or a ``GpuReader``. Resolved at ``start()``.
        on_reading: Called from the monitor thread with every ``Reading``. Exceptions it raises are
            logged to ``optuna_memprune.monitor`` (the first with its traceback) and counted in
            ``callback_errors``; they never stop the thread. It may call ``stop()``.
        max_timeline: Points kept for ``timeline``, >= 4, or 0 to keep none. Default 512. When full,
            the stored timeline is halved by ``downsample``, so long runs keep their extremes at a
            coarser resolution. A monitor that outlives what it watches (a process's own monitor kept
            across trials) should keep none: small objects that live on pin the allocator's arenas of the
            memory a trial freed.

    Notes:
        The sampler costs about 0.3% of one core at 10 Hz on a tree of 3 processes (see
        ``scripts/bench_monitor.py``); ``sampler_cpu_s`` is its own thread's CPU time, callbacks included.
        A process that lives and dies between two readings is never seen; its memory is in no reading.

        When the tree is this process (``pid=None``), ``threads`` includes the monitor's own thread.

    Examples:
        >>> with Monitor(interval=0.05, gpu=None) as mon:  # this process and its children
        ...     block = bytearray(b"1") * (256 << 20)
        ...     time.sleep(0.2)
        >>> mon.peak.rss - mon.timeline()[0][1] >= 256 << 20
        True
    """

    def __init__(
        self,
        pid: int | None = None,
        *,
        interval: float = 0.1,
        pss: bool = False,
        gpu: Any = "auto",
        on_reading: Callable[[Reading], None] | None = None,
        max_timeline: int = 512,
    ) -> None:
        check_int(pid, "pid", minimum=1, optional=True)
        check_number(interval, "interval", minimum=0, open_min=True)
        check_int(max_timeline, "max_timeline", minimum=0)
        if 0 < max_timeline < 4:
            raise ValueError(f"max_timeline must be 0 or an int >= 4, but got {max_timeline!r}.")
        if on_reading is not None and not callable(on_reading):
            raise ValueError(f"on_reading must be callable or None, but got {on_reading!r}.")
        if not (gpu is None or gpu == "auto" or callable(getattr(gpu, "used_by", None))):
            raise ValueError(f"gpu must be 'auto', None or a GpuReader, but got {gpu!r}.")
        self.pid = os.getpid() if pid is None else pid
        self.interval = float(interval)
        self.pss = bool(pss)
        self.on_reading = on_reading
        self.max_timeline = max_timeline
        self._gpu_arg = gpu
        self._lock = threading.Lock()
        self._tree_lock = threading.RLock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._tree: ProcessTree | None = None
        self._t0: float | None = None
        self._latest: Reading | None = None
        self._peak: Reading | None = None
        self._points: list[Point] = []
        self._next_pss = 0.0
        self._last_pss: int | None = None
        self.gone = False  #: True once the root process has exited
        self.readings = 0  #: readings taken so far
        self.callback_errors = 0  #: exceptions raised by on_reading
        self.read_errors = 0  #: unexpected errors while reading (logged)
        self.sampler_cpu_s = 0.0  #: CPU seconds used by the monitor thread

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Monitor:
        """Take the first reading and start the thread. Raises ``ProcessGone`` if the root is gone."""
        if self._thread is not None:
            raise RuntimeError("Monitor.start() was already called; make a new Monitor to watch again.")
        gpu = resolve_gpu(self._gpu_arg)
        tree = open_tree(self.pid)
        try:
            first = self._read(tree, gpu)
        except BaseException:
            tree.close()
            raise
        self._tree = tree
        self._t0 = first.t
        self._record(first)
        self._thread = threading.Thread(
            target=self._run, args=(tree, gpu, first), name=f"memprune-monitor-{self.pid}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it (at most ``timeout`` seconds; None waits). Safe to call twice,
        before ``start()``, after the root exited, and from ``on_reading`` (then it does not wait)."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                _logger.warning("monitor thread of pid %d did not stop within %s s", self.pid, timeout)

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the monitor thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- the thread --------------------------------------------------------------------------------
    def _run(self, tree: ProcessTree, gpu: GpuSource | None, first: Reading) -> None:
        cpu0 = time.thread_time()
        reading: Reading | None = first
        next_t = first.t
        try:
            while True:
                if reading is not None and self.on_reading is not None:
                    self._call_back(reading)
                self.sampler_cpu_s = time.thread_time() - cpu0
                next_t += self.interval
                now = time.monotonic()
                if next_t < now:  # overran: skip the missed ticks rather than burst
                    next_t = now
                if self._stop_event.wait(next_t - now):
                    break
                try:
                    with self._tree_lock:
                        reading = self._read(tree, gpu)
                except ProcessGone:
                    self.gone = True
                    _logger.debug("root process %d is gone; monitor stops", self.pid)
                    break
                except Exception:  # noqa: BLE001 - a sampler must outlive an odd reading
                    self.read_errors += 1
                    log = _logger.exception if self.read_errors == 1 else _logger.debug
                    log("reading process tree of pid %d failed", self.pid)
                    reading = None
                    continue
                self._record(reading)
        finally:
            with self._tree_lock:
                tree.close()
            self.sampler_cpu_s = time.thread_time() - cpu0

    def _read(self, tree: ProcessTree, gpu: GpuSource | None) -> Reading:
        now = time.monotonic()
        refresh = self.pss and now >= self._next_pss
        reading = tree.read(pss=refresh, gpu=gpu)
        if refresh:
            self._last_pss = reading.pss
            self._next_pss = now + tree.pss_cost / _PSS_CPU_SHARE
        elif self.pss:
            reading = reading._replace(pss=self._last_pss)
        return reading

    def _call_back(self, reading: Reading) -> None:
        try:
            self.on_reading(reading)  # type: ignore[misc]
        except Exception:  # the callback's errors are the callback's
            self.callback_errors += 1
            if self.callback_errors == 1:
                _logger.exception("on_reading raised; the monitor goes on (further errors logged at debug)")
            else:
                _logger.debug("on_reading raised again (%d so far)", self.callback_errors, exc_info=True)

    def _record(self, reading: Reading) -> None:
        with self._lock:
            self.readings += 1
            self._latest = reading
            self._peak = _merge_peak(self._peak, reading)
            if not self.max_timeline:
                return
            self._points.append((reading.t, reading.rss, reading.threads, reading.vram))
            if len(self._points) >= self.max_timeline:
                self._points = downsample(self._points, self.max_timeline // 2)

    # -- results -----------------------------------------------------------------------------------
    @property
    def latest(self) -> Reading | None:
        """The most recent reading (None before ``start()``)."""
        return self._latest

    @property
    def peak(self) -> Reading | None:
        """Per-field maxima over all readings (``t``: time of the RSS peak); None before ``start()``.

        ``peak.hwm`` is the highest sum of per-process ``VmHWM`` seen, so it includes peaks that fell
        between readings of processes that were alive at a reading.
        """
        return self._peak

    def timeline(self, max_points: int = 200) -> list[tuple[float, int, int, int | None]]:
        """``(t, rss, threads, vram)`` points, ``t`` in seconds since the first reading rounded to ms,
        downsampled to at most ``max_points`` (>= 2) keeping each column's maxima (see ``downsample``)."""
        check_int(max_points, "max_points", minimum=2)
        with self._lock:
            points = list(self._points)
        t0 = self._t0 or 0.0
        return [(round(p[0] - t0, 3), p[1], p[2], p[3]) for p in downsample(points, max_points)]

    def processes(self) -> list[Any]:
        """``psutil.Process`` handles of the tree's live processes (made once per (pid, start time) and
        checked against it, so a recycled pid is never returned); empty once the monitor has stopped."""
        tree = self._tree
        if not self.running or tree is None:
            return []
        with self._tree_lock:
            try:
                return tree.processes()
            except Exception:  # noqa: BLE001 - closed under us
                return []

    def __repr__(self) -> str:
        state = "gone" if self.gone else ("running" if self.running else "stopped")
        return f"Monitor(pid={self.pid}, interval={self.interval}, {state}, readings={self.readings})"
