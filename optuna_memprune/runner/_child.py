"""The code that runs inside a trial's own process: it opens the study, serves the checked params, runs the
objective and sends back how it ended.

The only module of the runner that runs in the child; knows nothing of the ledger, the watchdog or the
record (the parent writes those).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import logging
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.samplers import BaseSampler

from .. import _internals, cgroups
from ..guard.backend import peak_rss

SOFT_SIGNAL = signal.SIGUSR1  # runner -> child: the tree crossed the soft line; prune at should_prune()


class Outcome(str, enum.Enum):
    """How the objective ended in the trial's process (``LOST``: the runner could not read what it sent)."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAIL = "fail"
    LOST = "lost"


@dataclasses.dataclass(frozen=True)
class ChildResult:
    """What the trial's process sends the runner when the objective ended."""

    outcome: Outcome
    values: Any = None  # COMPLETE: the value(s)
    message: str = ""  # PRUNED: the message; FAIL: ``Type: text`` of the exception
    soft: bool = False  # PRUNED: the soft line answered the pruner
    error: BaseException | None = None  # FAIL: the exception, where it pickles
    traceback: str = ""  # FAIL
    stop_asked: bool = False  # the objective called ``study.stop()``
    peak_rss: int = 0  # the process's own peak RSS (VmHWM), bytes


#: What the runner records when the pipe gave nothing it could read.
LOST = ChildResult(Outcome.LOST)


@dataclasses.dataclass
class Payload:
    """What the parent hands a trial's process: the objective, where the trial lives, what was checked."""

    objective: Callable[[optuna.Trial], Any]
    storage: Any
    study_name: str
    trial_id: int
    assignment: dict[str, Any]
    space: dict[str, Any]
    sampler: BaseSampler
    pruner: Any
    gpu: int | None
    environ: dict[str, str]  # the runner's, now: the fork server was started with an older copy
    cwd: str
    cgroup: Any = None  # the trial's cgroup (``cgroups.Join``) or None: joined before anything else


class _Served(BaseSampler):
    """The child's sampler: the checked assignment as relative params, the base sampler for the rest."""

    def __init__(self, base: BaseSampler, assignment: dict[str, Any], space: dict[str, Any]) -> None:
        self._base, self._assignment, self._space = base, assignment, space

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return dict(self._space)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        return {n: self._assignment[n] for n in search_space if n in self._assignment}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self._base.sample_independent(study, trial, name, distribution)


class _Signalled(optuna.pruners.BasePruner):
    """The child's pruner: True once the runner signalled the soft line, else the user's pruner."""

    crossed = False
    answered = False

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def prune(self, study: Any, trial: Any) -> bool:
        if _Signalled.crossed:
            _Signalled.answered = True
            return True
        return False if self._inner is None else self._inner.prune(study, trial)


def child_main(payload: Payload, conn: Any) -> None:
    """The trial's process: run the objective, then send its ``ChildResult`` to the parent."""
    _join(payload.cgroup)
    _die_with_parent()
    _own_session()
    signal.signal(SOFT_SIGNAL, lambda *_: setattr(_Signalled, "crossed", True))
    os.environ.clear()
    os.environ.update(payload.environ)
    os.chdir(payload.cwd)
    if payload.gpu is not None:  # the ledger's indices are NVML's, which follow the PCI bus order
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = str(payload.gpu)
    payload.sampler.reseed_rng()  # every child starts from the parent's copy of the rng
    study = optuna.Study(
        payload.study_name,
        payload.storage,
        sampler=_Served(payload.sampler, payload.assignment, payload.space),
        pruner=_Signalled(payload.pruner),
    )
    trial = optuna.Trial(study, payload.trial_id)
    _internals.set_in_optimize_loop(study, True)  # trial.study.stop() works here as under Study.optimize
    try:
        value = payload.objective(trial)
    except optuna.TrialPruned as exc:
        ended = ChildResult(Outcome.PRUNED, message=str(exc), soft=_Signalled.answered)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        ended = ChildResult(
            Outcome.FAIL,
            message=f"{type(exc).__name__}: {exc}",
            error=_picklable(exc),
            traceback=traceback.format_exc(),
        )
    else:
        ended = ChildResult(Outcome.COMPLETE, values=_values(value))
    conn.send(dataclasses.replace(ended, stop_asked=_internals.stop_requested(study), peak_rss=peak_rss()))
    conn.close()


def _values(value: Any) -> Any:
    """The objective's value(s) as floats where possible (the parent's ``tell`` validates them)."""
    try:
        return [float(v) for v in value] if isinstance(value, Sequence) else float(value)
    except (TypeError, ValueError):
        return None


def _picklable(exc: BaseException) -> BaseException | None:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return None


def _join(spec: Any) -> None:
    """Enter the trial's cgroup and set its limit before any of the objective's code runs, so that every
    process it starts is in the group (the runner reads the group to tell whether this succeeded)."""
    if spec is None:
        return
    try:
        cgroups.join(spec)
    except (OSError, ValueError) as exc:
        logging.getLogger("optuna_memprune.guard").warning(
            "The trial's process could not join its cgroup (%s): it is watched by polling only.", exc
        )


def _own_session() -> None:
    """Lead a session (and process group) of its own: the runner kills what is left of the group once the
    trial's process ends (a helper the objective started and left running), and a Ctrl-C in the terminal
    reaches the runner only, which stops the trial's tree itself and ends its trial."""
    try:
        os.setsid()
    except OSError:  # already a group leader
        pass


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the fork server) exits, which it does when the
    runner that started it dies; a trial never outlives its runner.

    The server exits once no process holds the write end of its "alive" pipe; multiprocessing hands
    that end to every child too, which would keep the server (and so the trial) alive after the runner
    died. The child lets go of it (see ``_internals.forget_inherited_fork_server``).
    """
    _internals.forget_inherited_fork_server()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass
