"""The in-process trials' watch: one Monitor of this process per guard, shared by its running trials, each
seen through its ``Live`` (readings, peaks, timeline, soft and hard crossings, the forecast, the one
interrupt), and the exception that stops a trial in its own thread.

Owns the in-process hard stop (an exception raised in the trial's thread, never while it imports a module)
and the start levels of one guard's trials in this process (``Watch.levels``); knows nothing of how the
assignment was checked, how a trial ended or how the record is written.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import optuna

from ..monitor import Monitor, Reading, downsample
from ._core import policy_of, trials_of
from ._interrupt import importing, set_async_exc
from ._peak_rss import peak_rss
from ._start import ProcessLevels, charged, rss

if TYPE_CHECKING:
    from ._core import Guard
    from ._forecast_stop import StepForecast
    from ._trials import TrialGuardState

_logger = logging.getLogger("optuna_memprune.guard")

_TIMELINE_POINTS = 200  # points of the record's timeline
_KEEP_POINTS = 512  # points a running trial keeps before halving them (as Monitor does)
_IDLE_READINGS = 10  # the shared monitor stops after this many readings with no trial running


class MemoryBudgetExceeded(optuna.TrialPruned):
    """The trial's process crossed its budget while the trial ran; the trial ends PRUNED.

    ``reading`` is the monitor's reading that crossed (a ``optuna_memprune.monitor.Reading``).
    An objective that catches ``Exception`` around its training loop swallows it; let
    ``optuna.TrialPruned`` through.
    """

    def __init__(self, message: str = "", reading: Reading | None = None) -> None:
        super().__init__(message)
        self.reading = reading

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.reading))


class Interrupt(MemoryBudgetExceeded):
    """Raised asynchronously in the trial's thread (by class, without arguments); re-raised as its base."""


#: A trial that raised the process's peak RSS by at most this, within one reading, has its freed heap kept
#: (``Live.grew``): the peak reset at each trial's start made every page a rise, and ``malloc_trim`` ran
#: after 182 of 300 trivial trials (0.08 ms each, a fifth of the guard's time per trial in
#: ``scripts/bench_overhead.py``) for a few KiB. What it leaves is read in the next start level, no trial's own.
TRIM_ABOVE = 2**20


class Live:
    """The monitor's side of one trial: its readings, soft and hard crossings, the one interrupt."""

    def __init__(
        self,
        guard: Guard,
        state: TrialGuardState,
        thread_id: int,
        forecast: StepForecast | None = None,
        *,
        reset: bool = False,
    ) -> None:
        self._policy = policy_of(guard)
        self.forecast = forecast
        self._state = state
        self._thread_id = thread_id
        self._lock = threading.Lock()
        self._armed = True
        self._fired = False
        self._deferred = False  # an interrupt due while the trial's thread imported a module
        self._start = time.monotonic()
        self._reset = reset  # the peak was reset to the RSS now for this trial: from here on it is the trial's
        # this process's peak RSS so far: a rise above it happened in the trial. Reset, it is the RSS now: one
        # read of statm (1 us) instead of status (12 us; three a trial were a tenth of the guard's time)
        self._hwm0 = (reset and rss()) or peak_rss()
        self._hwm_end: int | None = None  # the peak ``peaks`` read at the end: ``grew`` uses it
        self._base = charged(self._policy, state)  # the soft line's margin is on the room above it
        self._peak: Reading | None = None
        self._points: list[tuple[float, int, int, int | None]] = []

    def on_reading(self, reading: Reading) -> None:
        """Called from the monitor's thread for every reading while the trial runs."""
        if reading.t < self._start:  # taken before this trial began (while an earlier one ran)
            return
        own = self._policy.own_threads  # the footprint's worker, lingering after the sampler's check
        if own:
            reading = reading._replace(threads=max(reading.threads - own, 0))
        with self._lock:
            self._peak = reading if self._peak is None else _max_reading(self._peak, reading)
            self._points.append((reading.t, reading.rss, reading.threads, reading.vram))
            if len(self._points) >= _KEEP_POINTS:
                self._points = downsample(self._points, _KEEP_POINTS // 2)
        state, policy = self._state, self._policy
        if state.soft_reading is None and policy.over(reading, policy.soft, state.allowance, self._base):
            state.soft_reading = reading
        if state.hard_reading is None and policy.over(reading, 1.0, state.allowance):
            state.hard_reading = reading
            self._fire()
        elif self.forecast is not None and self.forecast.on_reading(reading.t, reading.rss) is not None:
            self._fire()  # projected over the budget at the trial's last step
        elif self._deferred:
            self._fire()  # an import ran when it was due: at the first reading after it

    def forecast_reason(self) -> str | None:
        """The reason of the forecast stop, ``None`` when the forecast stopped nothing."""
        return None if self.forecast is None else self.forecast.reason()

    def _fire(self) -> None:
        """Interrupt the trial's thread, unless it is importing a module now: an exception there would leave
        a package half-imported in ``sys.modules`` for every later trial of the process (torch's optimizer
        importing ``torch._dynamo`` and sympy, stopped midway, broke every later trial). Then it waits for the
        next reading (``_deferred``)."""
        with self._lock:
            if self._armed and not self._fired:
                self._deferred = importing(self._thread_id)
                if not self._deferred:
                    set_async_exc(self._thread_id, Interrupt)
                    self._fired = True

    def disarm(self) -> None:
        """No interrupt can reach the trial's thread once this returns (an undelivered one is cleared)."""
        with self._lock:
            self._armed = False
            if self._fired:
                set_async_exc(self._thread_id, None)

    def grew(self) -> bool:
        """Whether the trial ran for at least one reading or raised the process's peak RSS by more than
        ``TRIM_ABOVE``: only then may it have left freed heap behind worth trimming."""
        with self._lock:
            hwm = self._hwm_end if self._hwm_end is not None else peak_rss()
            return self._peak is not None or hwm > self._hwm0 + TRIM_ABOVE

    def peaks(self) -> dict[str, int | None]:
        """The trial's highest ``ram``, ``vram`` and ``threads`` (``None``: no reading in the trial).

        ``ram`` is also raised to this process's peak RSS (VmHWM, ``peak_rss``) when that rose during
        the trial: it catches a spike between two readings, even in a trial shorter than one interval. Where
        that peak was reset for this trial (``reset``), it is the trial's peak even when it did not rise: a
        trial shorter than one reading that took no memory is observed at its start's RSS (the quadratic
        examples' 2 ms trials had no reading, so none was observed, and a learned guard's warm-up never
        ended: all 323 ran unchecked).
        """
        with self._lock:
            peak = self._peak
        hwm = self._hwm_end = peak_rss()
        ram = None if peak is None else peak.rss
        if hwm > self._hwm0 or self._reset:
            ram = hwm if ram is None else max(ram, hwm)
        return {
            "ram": ram,
            "vram": None if peak is None else peak.vram,
            "threads": None if peak is None else peak.threads,
        }

    def timeline(self) -> list[tuple[float, int, int, int | None]]:
        """``(t_s, rss, threads, vram)`` since the trial started, downsampled keeping each column's maxima."""
        with self._lock:
            points = downsample(self._points, _TIMELINE_POINTS)
        return [(round(max(t - self._start, 0.0), 3), rss, threads, vram) for t, rss, threads, vram in points]


class Watch:
    """One Monitor of this process per guard, shared by the guard's running trials, and their start levels.

    Started by the first trial, kept across trials (a trial pays no thread start), stopped by its own thread
    after ``_IDLE_READINGS`` readings without a trial. With ``n_jobs>1`` every running trial gets every
    reading of the one process.
    """

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self.levels = ProcessLevels()  # the trials' start levels in this process
        self._lock = threading.Lock()
        self._monitor: Monitor | None = None
        self._lives: dict[int, Live] = {}
        self._idle = 0

    def subscribe(self, live: Live, number: int) -> None:
        """Watch ``live``'s trial from the monitor's next reading on (started here if none runs)."""
        try:
            with self._lock:
                if self._monitor is None:
                    # no timeline of its own (each trial keeps its points): it lives across trials
                    self._monitor = Monitor(
                        interval=self._interval, on_reading=self._on_reading, max_timeline=0
                    ).start()
                self._lives[id(live)] = live
                self._idle = 0
        except Interrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - a trial without readings still runs
            _logger.warning("Trial %d: the monitor could not start (%s); it runs unwatched.", number, exc)

    @property
    def watching(self) -> bool:
        """Whether the monitor's thread runs now."""
        with self._lock:
            return self._monitor is not None

    def unsubscribe(self, live: Live) -> None:
        with self._lock:
            self._lives.pop(id(live), None)

    def _on_reading(self, reading: Reading) -> None:
        with self._lock:
            lives = list(self._lives.values())
            if not lives:
                self._idle += 1
                if self._idle >= _IDLE_READINGS and self._monitor is not None:
                    monitor, self._monitor = self._monitor, None
                    monitor.stop()  # from the monitor's own thread: returns at once, the thread ends
                return
        for live in lives:
            try:
                live.on_reading(reading)
            except Exception:  # one trial's bookkeeping must not starve the others
                _logger.exception("memprune: handling a reading failed")


_WATCHES_LOCK = threading.Lock()
# The guard's one Watch, kept beside its trial registry (both are per guard and per process) for as long as
# the guard lives: an unpickled guard gets a registry, and so a Watch, of its own.
_WATCHES: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()


def watch_of(guard: Guard) -> Watch:
    """The guard's shared monitor of this process (created on first use)."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get(trials_of(guard))
        if watch is None:
            watch = _WATCHES[trials_of(guard)] = Watch(policy_of(guard).interval)
        return watch


def _max_reading(a: Reading, b: Reading) -> Reading:
    def top(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else max(x, y)

    return Reading(
        t=b.t if b.rss > a.rss else a.t,
        rss=max(a.rss, b.rss),
        hwm=max(a.hwm, b.hwm),
        threads=max(a.threads, b.threads),
        processes=max(a.processes, b.processes),
        pss=top(a.pss, b.pss),
        vram=top(a.vram, b.vram),
    )
