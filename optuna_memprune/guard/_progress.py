"""The progress bar of the process-per-trial runner: trials done, running, rejected, pruned, host RAM.

Display only (rich, on stderr); knows the runner's counters and the ledger's totals, nothing else.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..units import format_bytes

if TYPE_CHECKING:
    from ._runner import _Runner

_REFRESH_S = 0.25


class Progress:
    """``with Progress(runner) as bar: runner.run(bar.update)``: one live line, refreshed 4 times a second."""

    def __init__(self, runner: "_Runner") -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        self._bar = Bar(TextColumn("memprune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task("", total=runner.n_trials)
        self._runner = runner
        self._last = 0.0

    def __enter__(self) -> "Progress":
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.update(self._runner, force=True)  # the last trials' end, which the throttle may have skipped
        self._bar.stop()

    def update(self, runner: "_Runner", force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last < _REFRESH_S and not force:
            return
        self._last = now
        self._bar.update(self._task, completed=sum(runner.counts[k] for k in ("done", "pruned", "failed")),
                         description=describe(runner))


def describe(runner: "_Runner") -> str:
    """``running 2 · done 5 · rejected 1 · pruned 3 · failed 0 · host RAM 3.1 GiB / 20.0 GiB``."""
    c = runner.counts
    text = (f"running {len(runner.children)} · done {c['done']} · rejected {c['rejected']} · "
            f"pruned {c['pruned']} · failed {c['failed']}")
    try:
        ram, cap = runner.ledger.in_use().ram, runner.ledger.capacity.ram
    except Exception:  # noqa: BLE001 - the bar must never stop the study
        return text
    return text + (f" · host RAM {format_bytes(ram)} / {format_bytes(cap)}" if cap else "")
