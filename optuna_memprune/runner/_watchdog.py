"""One trial's process seen from the parent: its watchdog (soft-line signal, stop at the budget), its
reservation and what came back from it.

Runs in the runner's process; knows nothing of the study's storage, the record or the ledger's rules.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any

from ..monitor import Monitor, Reading
from ..records import Enforcement, EnforcementMode
from ._child import LOST, SOFT_SIGNAL, ChildResult, Outcome

if TYPE_CHECKING:
    import optuna

    from ..guard.backend import Policy, StepForecast, TrialGuardState
    from ..ledger import Entry
    from ._cgroup import TrialCgroup

_logger = logging.getLogger("optuna_memprune.guard")

GRACE_S = 2.0  # SIGTERM to SIGKILL when the runner stops a trial's process tree


class TrialProcess:
    """One trial's process: its watchdog, its reservation (``entry``: None in a Ray task, where Ray holds
    it), what came back."""

    def __init__(
        self,
        policy: Policy,
        trial: optuna.Trial,
        state: TrialGuardState,
        margins: dict[str, float],
        entry: Entry | None,
        process: Any,
        conn: Any,
        cgroup: TrialCgroup | None = None,
        forecast: StepForecast | None = None,
    ) -> None:
        self.trial, self.state, self.margins = trial, state, margins
        self.reserved_prediction = state.prediction is not None  # else it reserved the budget
        self.entry, self.process, self.conn = entry, process, conn
        self.policy = policy
        self.result: ChildResult | None = None
        self.soft_reading: Reading | None = None
        self.hard_reading: Reading | None = None
        self.stopped_at: float | None = None
        self.killed = False
        self.ended = 0.0
        self.monitor: Monitor | None = None
        self.heartbeat: Any = None
        self.cgroup = cgroup  # the trial's group, where one was made (``_cgroup``)
        self.forecast = forecast  # the forecast stop (``guard.backend.StepForecast``), where the trial has a horizon
        self.gpu: int | None = None if entry is None else entry.gpu  # the GPU index it was placed on

    def watch(self) -> None:
        try:
            self.monitor = Monitor(self.process.pid, interval=self.policy.interval, on_reading=self.on_reading).start()
        except Exception as exc:  # noqa: BLE001 - gone already (it ends below) or unreadable
            _logger.warning("Trial %d: its process could not be watched: %s", self.trial.number, exc)

    def on_reading(self, reading: Reading) -> None:
        """From the watchdog's thread: signal the soft line once, stop the tree at the budget or when its RSS
        is projected over the budget at the trial's last step."""
        policy = self.policy
        if self.soft_reading is None and policy.over(reading, policy.soft):
            self.soft_reading = reading
            _signal(self.process.pid, SOFT_SIGNAL)
        if self.hard_reading is None and policy.over(reading, 1.0):
            self.hard_reading = reading
            self.stop(signal.SIGTERM)
        elif self.forecast is not None and self.forecast.on_reading(reading.t, reading.rss) is not None:
            self.stop(signal.SIGTERM)

    def take_result(self) -> None:
        """Read what the trial's process sent, once it is there (``LOST`` where the pipe broke)."""
        if self.result is None and self.conn.poll():
            try:
                self.result = self.conn.recv()
            except (EOFError, OSError):
                self.result = LOST
            except Exception as exc:  # noqa: BLE001 - an exception that does not unpickle
                self.result = ChildResult(Outcome.FAIL, message=f"the trial's result could not be read: {exc}")

    def kill_when_due(self) -> None:
        """SIGKILL the tree ``GRACE_S`` after it was stopped, if it is still there."""
        if self.stopped_at is not None and not self.killed and time.monotonic() - self.stopped_at > GRACE_S:
            self.stop(signal.SIGKILL)

    def end(self) -> None:
        """The trial's process has exited: note when, reap it and what it left behind (a helper, a data
        loader), and read what it sent last."""
        self.ended = time.monotonic()
        self.process.join()
        self.kill_group()
        self.take_result()

    def timeline(self) -> list[tuple[float, int, int, int | None]]:
        """The watchdog's readings, downsampled for the record."""
        return self.monitor.timeline() if self.monitor is not None else []

    def forecast_reason(self) -> str | None:
        """The reason of the forecast stop, ``None`` when the forecast stopped nothing."""
        return None if self.forecast is None else self.forecast.reason()

    def forecast_record(self) -> dict[str, Any]:
        """The record's ``forecast`` field: the fit that stopped the trial, empty when none did."""
        return {} if self.forecast is None else self.forecast.record()

    def stop(self, sig: int) -> None:
        """Send ``sig`` to every live process of the trial's tree (children first)."""
        procs = self.monitor.processes() if self.monitor is not None else []
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self.killed = self.killed or sig == signal.SIGKILL
        for proc in reversed(procs):
            try:
                proc.send_signal(sig)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        _signal(self.process.pid, sig)
        if sig == signal.SIGKILL:
            self.kill_group()

    def kernel_verdict(self, peak_ram: int | None) -> tuple[int | None, str | None]:
        """The trial's peak RAM with its cgroup's exact peak, and the reason when the kernel killed in the
        group at its limit (``TrialCgroup.verdict``); the polled peak and None without a group."""
        return (peak_ram, None) if self.cgroup is None else self.cgroup.verdict(peak_ram)

    def enforcement(self) -> Enforcement:
        """Which enforcement applied, for the record: the group's (``TrialCgroup.label``) or polling."""
        return Enforcement(EnforcementMode.POLLING) if self.cgroup is None else self.cgroup.label()

    def kill_group(self) -> None:
        """SIGKILL what is left of the trial's process group (its process leads a session of its own:
        ``_child``), the helpers that outlive it included; nothing once the whole group is gone. With a
        cgroup, everything in it: a grandchild in a session of its own, or whose parent died first."""
        if self.cgroup is not None:
            self.cgroup.kill()
        pid = self.process.pid
        if pid is None or pid == os.getpgid(0):
            return
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.heartbeat is not None:
            self.heartbeat.join()
        self.conn.close()
        if self.cgroup is not None:
            self.cgroup.remove()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
