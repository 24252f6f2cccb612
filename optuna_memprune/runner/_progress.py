"""The progress bar of the process-per-trial runner: trials done, running, rejected, pruned, host RAM.

Display only, on stderr: a live rich bar where rich (the ``report`` extra) is installed, else a plain line
every ``_PLAIN_EVERY_S`` and one at the end. Knows the ``Status`` values it is given, nothing of the runner or ledger.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..units import format_bytes

_REFRESH_S = 0.25
_PLAIN_EVERY_S = 10.0  # without rich: a line that scrolls, not one redrawn in place


class Status(NamedTuple):
    """Where a run stands: trials per outcome, and this host's reserved RAM (``None``: unknown)."""

    running: int
    done: int
    rejected: int
    pruned: int
    failed: int
    host_ram: int | None = None  # bytes reserved on this host now
    host_capacity: int | None = None  # bytes this host may reserve

    @property
    def finished(self) -> int:
        return self.done + self.pruned + self.failed


class Progress:
    """``with Progress(status, total) as bar: runner.run(bar.update)``: one live line, refreshed 4 times a
    second; ``status()`` is asked for the present ``Status`` only when the line is redrawn. Without
    rich, a plain line on stderr every ``_PLAIN_EVERY_S`` seconds and at the end."""

    def __init__(self, status: Callable[[], Status], total: int | None) -> None:
        self._status, self._total = status, total
        self._last = 0.0
        self._bar: Any = None
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar
        except ImportError:
            self._every, self._start = _PLAIN_EVERY_S, time.monotonic()
            return
        self._every = _REFRESH_S
        self._bar = Bar(
            TextColumn("memprune"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._bar.add_task("", total=total)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.update(force=True)  # the last trials' end, which the throttle may have skipped
        if self._bar is not None:
            self._bar.stop()

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last < self._every and not force:
            return
        self._last = now
        status = self._status()
        if self._bar is not None:
            self._bar.update(self._task, completed=status.finished, description=describe(status))
            return
        of = "" if self._total is None else f"/{self._total}"
        print(
            f"memprune {status.finished}{of} {time.monotonic() - self._start:.0f} s: {describe(status)}",
            file=sys.stderr,
            flush=True,
        )


def describe(status: Status) -> str:
    """``running 2 · done 5 · rejected 1 · pruned 3 · failed 0 · host RAM 3.10 GiB / 20.00 GiB``.

    Examples:
        >>> describe(Status(running=1, done=2, rejected=0, pruned=1, failed=0, host_ram=2**30, host_capacity=2**32))
        'running 1 · done 2 · rejected 0 · pruned 1 · failed 0 · host RAM 1.00 GiB / 4.00 GiB'
    """
    s = status
    text = f"running {s.running} · done {s.done} · rejected {s.rejected} · pruned {s.pruned} · failed {s.failed}"
    if s.host_ram is None or not s.host_capacity:
        return text
    return text + f" · host RAM {format_bytes(s.host_ram)} / {format_bytes(s.host_capacity)}"
