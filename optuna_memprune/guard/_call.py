"""The user's footprint function called under a time limit, with a cold-start allowance, and with time
spent calibrating this host not counted: in the main thread (a study's usual ``optimize(n_jobs=1)``) the
call runs there, interrupted past the limit by a SIGALRM timer; elsewhere, and in the main thread after one
call was interrupted (or while the program uses SIGALRM itself), in a worker thread abandoned (never
stopped) past the limit. The worker is kept between calls that come close together (a study's trials, a
clamp search's candidates): a thread started per call cost 0.4-0.7 ms on a loaded 2-core machine, handing a
call to a waiting thread 15-60 us back to back and 0.27 ms after 15 ms of other work in the caller (mostly
waking the other CPU); in the caller's thread the timer's set-up costs about 0.02 ms (``bench_overhead``:
the guard's time per trial 0.34-0.38 ms with the worker, 0.25-0.26 ms with the timer).

Owns the limit's rules and the words of its errors; knows nothing of budgets, caches or Optuna.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _internals, procfs

# the timer's set-up calls the C signal functions with the plain number (``_internals.c_signal``)
_raw_signal = _internals.c_signal()
_SIGALRM = int(getattr(signal, "SIGALRM", 0))

#: The limit of the first call that answers when ``footprint_timeout`` is lower: a cold start imports torch
#: and traces a network once (seconds on a busy 2-core machine), which later calls do not repeat.
FIRST_CALL_TIMEOUT_S = 15.0
#: The most a call may wait on this host's calibration (each probe has its own time limit too).
CALIBRATION_GRACE_S = 600.0
_POLL_S = 0.25  # how often a call over its limit looks for a running calibration probe
#: How long the worker thread waits for the next call before it ends: trials of a fast study come
#: milliseconds apart and keep it; a training trial's objective runs on without it after this second.
IDLE_S = 1.0
#: What a calibration probe's command line holds (``python -m optuna_memprune.estimate.probes.<name>``).
_PROBE_MODULE = b"optuna_memprune.estimate.probes."


class FootprintTimeout(TimeoutError):
    """The footprint function did not answer within the guard's ``footprint_timeout``."""


class NotAFootprint(TypeError):
    """The footprint function returned something else than a Footprint (``returned`` says what, in words)."""

    def __init__(self, returned: str) -> None:
        super().__init__(f"the footprint function returned {returned}, not a Footprint")
        self.returned = returned

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.returned,))


class NoFootprint(Exception):
    """Raised by a footprint that predicts nothing by design (``MonitorOnly``): the trial runs
    unchecked under the monitor with this message as its reason; no failure is counted or warned about."""


class MonitorOnly:
    """A footprint that predicts nothing: every trial runs unchecked under the monitor, ``why`` saying so.

    Pickles (a module-level class holding a string), so a guard built on it survives ``pickle``.

    Examples:
        >>> MonitorOnly("no footprint was given")({"x": 1})
        Traceback (most recent call last):
        ...
        optuna_memprune.guard._call.NoFootprint: no footprint was given
    """

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, params: dict[str, Any]) -> Any:
        raise NoFootprint(self.why)

    def __repr__(self) -> str:
        return f"MonitorOnly({self.why!r})"


class LimitedCall:
    """Calls ``function(params)`` one at a time, each within ``limit`` seconds (``None``: no limit, in the
    caller's thread).

    With a limit, a call made in the main thread once one call has answered runs there under a SIGALRM
    timer (where SIGALRM is free: its default action, not blocked, no timer set): past the limit the
    timer's handler raises ``_Expired`` (a ``BaseException``, which ``except Exception`` lets through) in the
    call at its next bytecode (a sleep or a lock wait is interrupted too), the caller gets
    ``FootprintTimeout``, and from then on calls go to the worker, so that a slow call (a network traced for the
    first time) is abandoned and completes rather than being cut short again. Every other call runs in a
    worker thread (one, ``memprune-footprint``, ended after ``IDLE_S`` without a call; ``threads`` says
    whether it runs); past the limit the caller gets ``FootprintTimeout`` and the call is abandoned (a
    thread cannot be stopped): its answer, when it comes, goes to the call's ``on_late``. While an abandoned
    call still runs, every call fails at once rather than queueing behind it. Until one call has answered,
    the limit is at least ``FIRST_CALL_TIMEOUT_S`` (a cold start, in the worker). Time while a calibration
    probe runs as a child of this process (a recipe's first prediction measures the host: seconds to a
    minute, each probe under its own limit) is not counted, up to ``CALIBRATION_GRACE_S``. One long C call
    (holding the GIL, in the worker) delays the caller until the call returns.
    """

    def __init__(self, function: Callable[[dict[str, Any]], Any], limit: float | None) -> None:
        self._function, self._limit = function, limit
        self._lock = threading.Lock()  # user footprints (torch tracing) need not be thread-safe
        self._late: _Run | None = None  # a call abandoned past its limit, maybe still running
        self._answered = False  # a call answered: the cold start is over
        self._inline = True  # main-thread calls run there under the timer, until one is interrupted
        self._worker = _Worker()

    @property
    def threads(self) -> int:
        """The threads this caller runs now (its worker: 0 or 1), which a reading of this process counts."""
        return int(self._worker.alive)

    def __call__(self, params: dict[str, Any], on_late: Callable[[Any], None]) -> Any:
        if self._limit is None:
            with self._lock:
                return self._function(params)
        first = not self._answered
        limit = max(self._limit, FIRST_CALL_TIMEOUT_S) if first else self._limit
        took = f"the footprint took longer than {limit:g} s" + (" on its first call" if first else "")
        if not self._lock.acquire(timeout=limit):
            raise FootprintTimeout(f"{took} (waiting behind another trial's call)")
        try:
            late = self._late
            if late is not None and not late.done.is_set():
                raise FootprintTimeout(f"{took} (an earlier call that took longer than {late.limit:g} s still runs)")
            if not first and self._inline and _alarm_free():
                return self._call_here(params, limit, took)
            run = _Run(self._function, params, limit, lambda done: self._answer(done, on_late))
            self._worker.submit(run)
            if not _wait(run, limit):
                run.abandon()
                self._late = run
                raise FootprintTimeout(took)
            self._answered = True
        finally:
            self._lock.release()
        if run.error is not None:
            raise run.error
        return run.result

    def _call_here(self, params: dict[str, Any], limit: float, took: str) -> Any:
        """The call in this (the main) thread, interrupted by ``FootprintTimeout`` past ``limit``."""
        clock = _Clock(limit)

        def on_alarm(signum: int, frame: Any) -> None:
            # At every tick past the limit while the function runs: one that caught the interrupt and went
            # on (a bare ``except:`` in a retry loop) is interrupted again. Never once it returned (``running``).
            if clock.running and clock.tick():
                clock.fired = True
                raise _Expired

        previous = _raw_signal.signal(_SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, min(_POLL_S, limit), _POLL_S)
            try:
                result = self._function(params)
            finally:
                clock.running = False
        except (_Expired, Exception):
            if not clock.fired:  # the function's own error, within its limit
                raise
        finally:
            clock.running = False  # first: the ticks are _POLL_S apart, and from here on none raises
            signal.setitimer(signal.ITIMER_REAL, 0)
            _raw_signal.signal(_SIGALRM, previous)
        if clock.fired:  # interrupted, or it caught the interrupt and failed or answered after its limit
            self._inline = False  # later calls go to the worker, where a slow one completes
            raise FootprintTimeout(took)
        self._answered = True
        return result

    def _answer(self, run: _Run, on_late: Callable[[Any], None]) -> None:
        self._answered = True  # even an error: the cold start is over
        if run.error is None:
            on_late(run.result)


class _Worker:
    """A daemon thread running calls one after another, started at the first and ended after ``IDLE_S``
    seconds without one (a later call starts it again)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Run] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.alive = False

    def submit(self, run: _Run) -> None:
        with self._lock:
            self._jobs.put(run)
            if not self.alive:
                self.alive = True
                threading.Thread(target=self._loop, name="memprune-footprint", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                run = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:  # a call submitted while the wait ended is run, not left queued
                    if self._jobs.empty():
                        self.alive = False
                        return
                continue
            run.run()


class _Run:
    """One call in its worker thread; ``on_late(self)`` once it returns after being abandoned."""

    def __init__(
        self,
        function: Callable[[dict[str, Any]], Any],
        params: dict[str, Any],
        limit: float,
        on_late: Callable[[_Run], None],
    ) -> None:
        self._function, self._params, self.limit, self._on_late = function, params, limit, on_late
        self._lock = threading.Lock()
        self._abandoned = False
        self.done = _Latch()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._function(self._params)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc
        with self._lock:
            self.done.set()
            late = self._abandoned
        if late:
            self._on_late(self)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            answered = self.done.is_set()  # it returned between the wait and now
        if answered:
            self._on_late(self)


class _Latch:
    """Set once, waited on by the caller: a held lock that ``set`` releases. An ``Event`` (a condition, a
    lock made per wait) took 0.36 ms from call to answer after 15 ms of other work in the caller (TPE's),
    this 0.27 ms: most of either is waking the other thread's CPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        self._set = True
        self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether it is set, waiting up to ``timeout`` seconds for it."""
        if not self._set and self._lock.acquire(timeout=timeout):
            self._lock.release()  # another wait returns at once too
        return self._set


class _Expired(BaseException):
    """Raised by the timer into a call in the main thread past its limit; ``LimitedCall`` turns it into
    ``FootprintTimeout``. Not an ``Exception``: the ``except Exception`` of the code it lands in (a
    recipe's fallback, a footprint's own) lets it through instead of taking it for that code's error and
    caching what it falls back to."""


class _Clock:
    """A call's time against its limit, looked at every ``_POLL_S`` at most: seconds while a calibration
    probe runs are free (up to ``CALIBRATION_GRACE_S``)."""

    def __init__(self, limit: float) -> None:
        self.limit, self.charged = limit, 0.0
        self.start = self._last = time.monotonic()
        self.running, self.fired = True, False  # for the timer's handler

    def tick(self) -> bool:
        """Charge the time since the last tick (unless a probe runs); whether the limit is used up."""
        now = time.monotonic()
        if not _calibrating():
            self.charged += now - self._last
        self._last = now
        return self.charged >= self.limit or now - self.start >= self.limit + CALIBRATION_GRACE_S


def _wait(run: _Run, limit: float) -> bool:
    """Wait until ``run`` is done or has used ``limit`` seconds (``_Clock``). Whether it is done."""
    clock = _Clock(limit)
    while True:
        if run.done.wait(max(0.0, min(_POLL_S, limit - clock.charged))):
            return True
        if clock.tick():
            return run.done.is_set()


def _alarm_free() -> bool:
    """Whether a call may run in this thread under a SIGALRM timer: the main thread, where the program
    neither handles nor blocks SIGALRM and no timer is set (``signal.alarm``, ``setitimer``, a test runner's
    time limit)."""
    return (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        and _raw_signal.getsignal(_SIGALRM) == signal.SIG_DFL
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        and _SIGALRM not in _raw_signal.pthread_sigmask(signal.SIG_BLOCK, [])
    )


def _calibrating() -> bool:
    """Whether a calibration probe runs as a child of this process (any of its threads')."""
    try:
        kids = [
            pid
            for tid in os.listdir("/proc/self/task")
            for pid in procfs.children(procfs.read(f"/proc/self/task/{tid}/children"))
        ]
        return any(_PROBE_MODULE in procfs.read(f"/proc/{pid}/cmdline") for pid in kids)
    except OSError:  # a thread or child that just ended: the next poll looks again
        return False
