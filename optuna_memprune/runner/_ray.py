"""The Ray backend of ``optimize()`` (``backend="ray"``): each trial a Ray task (its own process forked from
the task's worker) on whichever node Ray places it, asking for what the local runner would reserve on its ledger
(the prediction x the learned margin, ``_reserve``) as Ray's ``memory``, ``num_cpus`` and ``num_gpus``
(``_ray_nodes``); at most ``n_jobs`` tasks in flight.

The driver asks and checks each trial and ends it (``_tell``, as the local runner does), rejects the trial no
alive node can ever hold (before it is submitted, or while it waits once its node is gone), writes the record
of each task that came back (``_ending.finished_record``, from ``_ray_task.TaskEnd``) and fails the trial whose
task Ray lost (its node or worker died), asking it again with the same params where ``ray_retries`` allows.

Runs in the driver's process; imports Ray only when called. Knows nothing of what runs in the task beyond
``TaskSpec`` and ``TaskEnd``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _internals
from .._extras import MissingExtra
from ..guard import GuardedSampler
from ..guard.backend import OutOfMemory
from ..records import Decision
from ._driver import Driver
from ._ending import Ending, finished_record
from ._progress import Status
from ._ray_nodes import Ask, alive_nodes, ask_for, gpu_memory, misfit
from ._ray_task import TaskEnd, TaskSpec, run_trial
from ._signals import why_ended
from ._storage import retry as _retry

if TYPE_CHECKING:
    from ..guard.backend import Guard, TrialGuardState

_logger = logging.getLogger("optuna_memprune.guard")

_TICK_S = 0.1  # the driver's loop wakes at least this often
#: How often the driver checks that every task still waiting can be placed on an alive node (one GCS read).
_RECHECK_S = 2.0
_NO_PEAKS: dict[str, int | None] = {"ram": None, "vram": None, "threads": None}


def import_ray() -> Any:
    """The ``ray`` module, or the one-line error naming the ``ray`` extra."""
    try:
        import ray
    except ImportError as exc:
        missing = MissingExtra.of(exc, "optimize(backend='ray')")
        if missing is None:
            raise
        raise missing from None
    return ray


def check_storage(study: optuna.Study) -> None:
    """ValueError unless the study's storage can go to the tasks (each opens it on its node): a storage every
    node reaches is an RDB URL (a SQLite file on a shared filesystem, PostgreSQL, MySQL) or a Journal file,
    and it must pickle."""
    storage = _internals.storage_of(study)
    if isinstance(storage, optuna.storages.InMemoryStorage) or _internals.storage_location(study) in (
        None,
        "sqlite:///:memory:",
        "sqlite://",
    ):
        raise ValueError(
            "optimize(backend='ray') runs each trial in a Ray task that opens the study's storage on its own node: "
            "create the study with a storage every node reaches (postgresql+psycopg://..., sqlite:///file.db on a "
            "shared filesystem or a one-machine cluster, a Journal file), not in memory."
        )
    try:
        pickle.dumps(storage)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the storage's
        raise ValueError(
            f"optimize(backend='ray') sends the study's storage to each task, but {type(storage).__name__} does not "
            f"pickle: {type(exc).__name__}: {exc}"
        ) from None


def run_on_ray(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], Any],
    guard: Guard,
    *,
    n_trials: int | None,
    timeout: float | None,
    n_jobs: int,
    catch: tuple[type[BaseException], ...],
    callbacks: list[Callable[[optuna.Study, FrozenTrial], None]],
    show: bool,
    address: str | None,
    retries: int,
) -> None:
    """``optimize(backend="ray")`` once its arguments are checked: connect (this process's connection where
    ``ray.init()`` was called, else ``ray.init(address=address)``, closed again at the end), run, report."""
    check_storage(study)
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address)
    elif address is not None:
        _logger.info("Ray is connected already: ray_address=%r is not used.", address)
    try:
        if n_jobs == -1:
            n_jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
        runner = RayRunner(
            study,
            objective,
            guard,
            n_trials=n_trials,
            timeout=timeout,
            n_jobs=n_jobs,
            catch=catch,
            callbacks=callbacks,
            retries=retries,
        )
        if show:
            from ._progress import Progress

            with Progress(runner.status, n_trials) as bar:
                runner.run(bar.update)
        else:
            runner.run(None)
    finally:
        if started:
            ray.shutdown()


@dataclasses.dataclass
class _InFlight:
    """A trial whose task was submitted; ``unplaceable``: why no alive node can hold it any more (cancelled)."""

    trial: optuna.Trial
    state: TrialGuardState
    margins: dict[str, float]
    ask: Ask
    unplaceable: str = ""


class RayRunner(Driver):
    """The driver's loop of ``optimize(backend="ray")``: ask, check, place, submit, collect, tell."""

    def __init__(
        self,
        study: optuna.Study,
        objective: Callable[[optuna.Trial], Any],
        guard: Guard,
        *,
        n_trials: int | None,
        timeout: float | None,
        n_jobs: int,
        catch: tuple[type[BaseException], ...],
        callbacks: list[Callable[[optuna.Study, FrozenTrial], None]],
        retries: int,
    ) -> None:
        self.ray = import_ray()
        self.host = socket.gethostname()
        super().__init__(
            study,
            objective,
            guard,
            n_trials=n_trials,
            timeout=timeout,
            catch=catch,
            callbacks=callbacks,
            host=self.host,
        )
        self.n_jobs, self.retries = n_jobs, retries
        # Workers are reused (max_calls=0, also for GPU tasks): each trial runs in a process of its own forked from
        # the worker, which ends with the trial; a fresh worker per trial cost 3.5 s of start and imports on 2 cores.
        self.task = self.ray.remote(max_calls=0, max_retries=0)(run_trial)  # never rerun by Ray
        self.in_flight: dict[Any, _InFlight] = {}
        self.deferred: tuple[optuna.Trial, TrialGuardState, int] | None = None  # a rejection decided again later
        self.gpu_memory: int | None = None
        self._probed = False
        self._rechecked = time.monotonic()

    def status(self) -> Status:
        c = self.teller.counts
        return Status(
            running=len(self.in_flight), done=c["done"], rejected=c["rejected"], pruned=c["pruned"], failed=c["failed"]
        )

    def _loop(self, on_tick: Callable[[], None] | None) -> None:
        try:
            self.dead_runners.end_trials()
            while True:
                self._collect(0)
                deferred = self.deferred
                if deferred is not None and (self.ended > deferred[2] or not self.in_flight):
                    self.deferred = None
                    if self._may_go_on():  # not after study.stop(), the timeout or a fatal error
                        self.teller.check_again(deferred[1])
                    self._place(*deferred[:2])
                while self._may_ask() and self.deferred is None and len(self.in_flight) < self.n_jobs:
                    self._ask()
                if on_tick is not None:
                    on_tick()
                if not self.in_flight and self.deferred is None and not self._may_ask():
                    break
                self._collect(_TICK_S)
                self._recheck()
        except BaseException as exc:
            self._abort(why_ended(exc))
            raise
        if self.fatal is not None:
            raise self.fatal

    # -- before the task ---------------------------------------------------------------------------

    def _ask(self) -> None:
        trial = self.teller.ask(self.mark)
        self.asked += 1
        state = self.teller.check(trial)
        self.dead_runners.end_trials(_internals.cached_trials(self.study))  # the trials the ask read
        if self.in_flight and GuardedSampler.may_change(state, len(self.in_flight)):  # decided again once one ends
            self.deferred = (trial, state, self.ended)
            return
        self._place(trial, state)

    def _place(self, trial: optuna.Trial, state: TrialGuardState) -> None:
        if state.decision is Decision.REJECTED:
            self.teller.end_rejected(trial, state)
            return
        margins = _retry("reading the finished trials", self.reservations.margins)
        figures = self.reservations.figures(state.prediction, margins)
        nodes = alive_nodes()
        if figures["vram"] > 0 and not self._probed:
            self._probed, self.gpu_memory = True, gpu_memory(nodes)
        ask = ask_for(
            figures,
            threads_budgeted=self.policy.budget.threads is not None,
            unchecked=state.prediction is None,
            nodes=nodes,
            gpu_memory=self.gpu_memory,
        )
        why = misfit(ask, nodes, self.gpu_memory)
        if why:
            self.teller.end_rejected(trial, state, reason=f"no node of the Ray cluster can ever run it: {why}")
            return
        spec = TaskSpec(
            objective=self.objective,
            # pickled now: its cache must know this trial
            storage=pickle.dumps(_internals.storage_for_child(self.teller.storage)),
            study_name=self.study.study_name,
            trial_id=state.trial_id,
            state=state,
            guard=self.guard,
            margins=margins,
            sampler=self.base_sampler,
            pruner=self.inner_pruner,
            catch=self.catch,
            cwd=os.getcwd(),
            heartbeats=self.teller.heartbeats,
        )
        try:
            ref = self.task.options(name=f"memprune-trial-{trial.number}", **ask.options()).remote(spec)
        except Exception as exc:
            reason = f"the trial could not be sent to Ray: {type(exc).__name__}: {exc}"
            self.teller.fail_before_launch(trial, state, reason)
            if "pickl" in str(exc).lower() or isinstance(exc, (TypeError, AttributeError)):
                raise TypeError(
                    f"{reason}. optimize(backend='ray') sends the objective, the guard, the sampler and the pruner "
                    "to each task: they must pickle (cloudpickle)."
                ) from exc
            raise
        _logger.info("Trial %d submitted to Ray, asking %s.", trial.number, ask.describe())
        self.in_flight[ref] = _InFlight(trial, state, margins, ask)

    # -- after the task ----------------------------------------------------------------------------

    def _collect(self, timeout: float) -> None:
        """End the trials whose tasks are done, waiting up to ``timeout`` seconds for the first."""
        if not self.in_flight:
            return
        refs = list(self.in_flight)
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self.ended += 1
            self._finish(ref, self.in_flight.pop(ref))

    def _finish(self, ref: Any, task: _InFlight) -> None:
        exceptions = self.ray.exceptions
        lost = None
        try:
            end: TaskEnd = self.ray.get(ref)
        except exceptions.TaskCancelledError:
            if task.unplaceable:  # cancelled here while it waited: its node is gone
                reason = f"no node of the Ray cluster can run it any more: {task.unplaceable}"
                self.teller.end_rejected(task.trial, task.state, reason=reason)
                return
            lost = "its Ray task was cancelled"
        except exceptions.OutOfMemoryError as exc:  # out of memory ends PRUNED (infeasible), never FAIL
            oom = OutOfMemory("ram", f"killed by Ray's memory monitor: {_first_line(exc)}")
            end = TaskEnd.lost(Ending(TrialState.PRUNED, dict(_NO_PEAKS), oom=oom), task.state, task.margins)
        except exceptions.RayTaskError as exc:  # the task's own code failed: on every node alike, most likely
            cause = getattr(exc, "cause", None) or exc
            lost = f"its Ray task failed: {type(cause).__name__}: {_first_line(cause)}"
            if self.fatal is None:
                hint = (
                    ". Each task imports what it is sent (the objective's module, the footprint's): install it on "
                    "every node, give ray.init a runtime_env (py_modules, working_dir), or define them in the script "
                    "(sent by value)."
                )
                imports = isinstance(cause, ImportError) or "No module named" in str(cause)
                self.fatal = RuntimeError(f"Trial {task.trial.number}: {lost}" + (hint if imports else ""))
        except exceptions.RayError as exc:  # its worker or node died
            lost = f"its Ray task was lost: {type(exc).__name__}: {_first_line(exc)}"
        if lost is not None:
            end = TaskEnd.lost(Ending(TrialState.FAIL, dict(_NO_PEAKS), failed=lost), task.state, task.margins)
        end = dataclasses.replace(end, state=task.state, margins=task.margins)
        ending = end.ending
        if ending.stop_asked:  # the objective called trial.study.stop()
            self.study.stop()
        frozen = _retry("reading the trial", lambda: self.teller.storage.get_trial(task.state.trial_id))
        record = finished_record(self.policy, end, ending, frozen.params, end.host)
        ended = self.teller.end(task.trial, task.state, record, ending.state, ending.values)
        if ending.failure is not None and self.fatal is None:
            self.fatal = ending.failure
        if lost is not None and self.fatal is None:
            self._ask_again(ended, task)

    def _ask_again(self, failed: FrozenTrial, task: _InFlight) -> None:
        """Enqueue a trial whose task Ray lost with the same params, as Optuna's ``RetryFailedTrialCallback``
        does (``failed_trial``, ``retry_history``), while its retries are fewer than ``ray_retries``."""
        history = list(failed.system_attrs.get("retry_history", []))
        if len(history) >= self.retries:
            return
        params = dict(failed.params) or dict(task.state.assignment)
        system_attrs = {
            "fixed_params": params,
            "failed_trial": failed.system_attrs.get("failed_trial", failed.number),
            "retry_history": [*history, failed.number],
        }
        waiting = optuna.trial.create_trial(state=TrialState.WAITING, system_attrs=system_attrs)
        _retry("asking the trial again", lambda: self.study.add_trial(waiting))
        _logger.warning("Trial %d: its Ray task was lost; asked again with the same params.", failed.number)

    def _recheck(self) -> None:
        """Cancel the tasks that no alive node can hold any more (their node left the cluster while they
        waited): Ray would keep them waiting forever."""
        if not self.in_flight or time.monotonic() - self._rechecked < _RECHECK_S:
            return
        self._rechecked = time.monotonic()
        nodes = alive_nodes()
        for ref, task in self.in_flight.items():
            why = "" if task.unplaceable else misfit(task.ask, nodes, self.gpu_memory)
            if why:
                task.unplaceable = why
                self.ray.cancel(ref, force=True)

    def _abort(self, why: str) -> None:
        """The driver is ending abnormally (Ctrl-C, SIGTERM, an error): cancel every task (its worker and the
        trial's process die with it), fail its trial with ``why``."""
        for ref in self.in_flight:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # gone already; the trial is failed below all the same
                _logger.debug("cancelling a Ray task failed", exc_info=True)
        for task in self.in_flight.values():
            try:
                record = self.policy.record(task.state, {}, reason=f"{task.state.reason}; {why} while the trial ran")
                self.teller.end(task.trial, task.state, record, TrialState.FAIL)
            except Exception:  # best effort: the next driver of this host fails what is left
                _logger.exception("Trial %d: could not be failed", task.trial.number)
        self.in_flight.clear()
        if self.deferred is not None:
            trial, state, _ = self.deferred
            self.deferred = None
            try:
                self.teller.fail_before_launch(trial, state, f"{why} while the trial waited to be checked again")
            except Exception:
                _logger.exception("Trial %d: could not be failed", trial.number)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
