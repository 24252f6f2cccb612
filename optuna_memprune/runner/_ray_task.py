"""The code that runs in a trial's Ray task, on whichever node Ray placed it: the trial's own process forked
from the task's worker and running ``_child``'s code (the objective on a trial loaded from the study's
storage), watched by the runner's watchdog (``_watchdog.TrialProcess``: the soft-line signal, the stop at the
budget, the forecast stop), judged as the runner judges it (``_ending.judge``) and sent back to the driver as
a ``TaskEnd``, which the driver's record reads as the runner's reads a ``TrialProcess``.

Runs in a Ray worker only (reused across trials: each trial's process is forked anew and ends with it); knows
nothing of the driver's loop, of Ray's resources or of the record's fields (the driver writes the record and the
final state).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Any

import optuna

from .. import _internals, procfs
from ..guard.backend import policy_of, trial_forecast
from ..records import Enforcement, EnforcementMode
from ._child import Payload, child_main
from ._ending import Ending, judge
from ._watchdog import TrialProcess

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

    from ..guard.backend import Guard, TrialGuardState
    from ..monitor import Reading

_TICK_S = 0.05  # the task's watch loop wakes at least this often (as the runner's loop)


@dataclasses.dataclass
class TaskSpec:
    """What the driver hands a trial's Ray task."""

    objective: Callable[[optuna.Trial], Any]
    storage: bytes  # the study's storage, pickled: opened once the task is in the driver's directory
    study_name: str
    trial_id: int
    state: TrialGuardState
    guard: Guard
    margins: dict[str, float]
    sampler: BaseSampler
    pruner: Any
    catch: tuple[type[BaseException], ...]
    cwd: str  # the driver's working directory: where relative storage paths point, where it exists here
    heartbeats: bool


@dataclasses.dataclass
class TaskEnd:
    """What a trial's Ray task sends back: how its process ended (``ending``) and what the record reads of
    its watch, with the names of a ``TrialProcess`` (``_ending.Watched``). A task Ray lost sends nothing; the
    driver makes one with ``lost``."""

    ending: Ending
    state: TrialGuardState
    margins: dict[str, float]
    reserved_prediction: bool
    host: str | None = None  # the node's host name
    soft_reading: Reading | None = None
    hard_reading: Reading | None = None
    ended: float = 0.0  # on the node's clock, as the readings' ``t``
    gpu: int | None = None  # the first GPU Ray gave the task
    readings: list[tuple[float, int, int, int | None]] = dataclasses.field(default_factory=list)
    enforced: Enforcement = dataclasses.field(default_factory=lambda: Enforcement(EnforcementMode.POLLING))
    forecast: str | None = None
    forecast_fit: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def lost(cls, ending: Ending, state: TrialGuardState, margins: dict[str, float]) -> TaskEnd:
        """The end of a trial whose task Ray lost (its node or worker died): no reading came back."""
        return cls(ending, state, margins, state.prediction is not None)

    def timeline(self) -> list[tuple[float, int, int, int | None]]:
        return self.readings

    def enforcement(self) -> Enforcement:
        return self.enforced

    def forecast_reason(self) -> str | None:
        return self.forecast

    def forecast_record(self) -> dict[str, Any]:
        return self.forecast_fit


def run_trial(spec: TaskSpec) -> TaskEnd:
    """The trial's Ray task: start its process, watch it to its end, judge it; the ``TaskEnd``."""
    import ray

    if os.path.isdir(spec.cwd):
        os.chdir(spec.cwd)  # a relative SQLite or Journal path means what it means to the driver
    storage = pickle.loads(spec.storage)
    study = optuna.Study(spec.study_name, storage, sampler=optuna.samplers.RandomSampler())
    trial = optuna.Trial(study, spec.trial_id)
    policy, state = policy_of(spec.guard), spec.state
    gpus = ray.get_gpu_ids()
    payload = Payload(
        objective=spec.objective,
        storage=pickle.loads(spec.storage),  # the trial's own, not connected before the fork
        study_name=spec.study_name,
        trial_id=spec.trial_id,
        assignment=dict(state.assignment),
        space=dict(state.space),
        sampler=spec.sampler,
        pruner=spec.pruner,
        gpu=None,  # Ray set CUDA_VISIBLE_DEVICES for the task: the trial inherits it
        environ=dict(os.environ),
        cwd=os.getcwd(),
    )
    # fork: the objective came to this worker by value (a script's function) and need not pickle again
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    state.oom_kills = procfs.oom_kills()
    process = ctx.Process(target=_trial_process, args=(payload, send), name=f"memprune-trial-{trial.number}")
    try:
        process.start()
    finally:
        send.close()
    child = TrialProcess(
        policy, trial, state, spec.margins, None, process, receive, None, trial_forecast(spec.guard, storage, state)
    )
    child.gpu = int(gpus[0]) if gpus else None
    child.watch()
    if spec.heartbeats:
        child.heartbeat = _internals.heartbeat_thread(study, spec.trial_id)
        child.heartbeat.start()
    try:
        while process.is_alive():
            wait_any([receive, process.sentinel], timeout=_TICK_S)
            child.take_result()
            child.kill_when_due()
        child.end()
        ending = judge(child, spec.catch)
    finally:
        child.close()
    return TaskEnd(
        ending,
        state,
        spec.margins,
        child.reserved_prediction,
        host=socket.gethostname(),
        soft_reading=child.soft_reading,
        hard_reading=child.hard_reading,
        ended=child.ended,
        gpu=child.gpu,
        readings=child.timeline(),
        enforced=child.enforcement(),
        forecast=child.forecast_reason(),
        forecast_fit=child.forecast_record(),
    )


def _trial_process(payload: Payload, conn: Any) -> None:
    """The trial's process: Ray's signal handlers of the worker it was forked from put back to the
    defaults (a stop at the budget is a plain SIGTERM), then ``_child``'s code."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    child_main(payload, conn)


def gpu_totals() -> tuple[int, ...]:
    """The memory of each GPU of the node this task runs on, by NVML; () without NVML or GPUs."""
    from ..ledger import HostBudget

    return HostBudget(ram=None, gpus="auto", headroom=0.0).resolve().gpus
