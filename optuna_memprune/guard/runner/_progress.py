"""The progress bar of the process-per-trial runner: trials done, running, rejected, pruned, host RAM.

Display only (rich, on stderr); knows the ``Status`` values it is given, nothing of the runner or ledger.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from ...units import format_bytes

_REFRESH_S = 0.25


class Status(NamedTuple):
    """Where a run stands: trials per outcome, and this host's reserved RAM (``None``: unknown)."""

    running: int
    done: int
    rejected: int
    pruned: int
    failed: int
    host_ram: int | None = None          # bytes reserved on this host now
    host_capacity: int | None = None     # bytes this host may reserve

    @property
    def finished(self) -> int:
        return self.done + self.pruned + self.failed


class Progress:
    """``with Progress(status, total) as bar: runner.run(bar.update)``: one live line, refreshed 4 times a
    second; ``status()`` is asked for the present :class:`Status` only when the line is redrawn."""

    def __init__(self, status: Callable[[], Status], total: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        self._bar = Bar(TextColumn("memprune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task("", total=total)
        self._status = status
        self._last = 0.0

    def __enter__(self) -> "Progress":
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.update(force=True)  # the last trials' end, which the throttle may have skipped
        self._bar.stop()

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last < _REFRESH_S and not force:
            return
        self._last = now
        status = self._status()
        self._bar.update(self._task, completed=status.finished, description=describe(status))


def describe(status: Status) -> str:
    """``running 2 · done 5 · rejected 1 · pruned 3 · failed 0 · host RAM 3.10 GiB / 20.00 GiB``.

    Example:
        >>> describe(Status(running=1, done=2, rejected=0, pruned=1, failed=0, host_ram=2**30, host_capacity=2**32))
        'running 1 · done 2 · rejected 0 · pruned 1 · failed 0 · host RAM 1.00 GiB / 4.00 GiB'
    """
    s = status
    text = f"running {s.running} · done {s.done} · rejected {s.rejected} · pruned {s.pruned} · failed {s.failed}"
    if s.host_ram is None or not s.host_capacity:
        return text
    return text + f" · host RAM {format_bytes(s.host_ram)} / {format_bytes(s.host_capacity)}"
