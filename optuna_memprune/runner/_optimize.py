"""optimize(): one child process per trial, admitted by the host ledger, watched and stopped from outside.

Owns the call's argument checks and what lives exactly as long as the call (the ledger it opened, the
progress bar, the fork server); the loop itself is ``_loop``'s, the trial's process ``_child``'s.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from .. import _internals
from ..guard import MemoryGuard
from ..guard.backend import policy_of, warnings_of
from ..units import check_int, check_number
from ._cgroup import Enforcer
from ._forkserver import stop_fork_server
from ._loop import Runner
from ._progress import Progress
from ._reserve import check_budget_fits

if TYPE_CHECKING:
    from ..ledger import HostBudget, Ledger


_logger = logging.getLogger("optuna_memprune.guard")


def optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], Any],
    *,
    guard: MemoryGuard,
    n_trials: int | None = None,
    timeout: float | None = None,
    n_jobs: int = 1,
    catch: Iterable[type[Exception]] | type[Exception] = (),
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
    show_progress_bar: bool | None = None,
    host: HostBudget | Ledger | None = None,
    on_host_full: str = "wait",
    enforce: str = "auto",
    n_workers: int | None = None,
    progress: bool | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    ray_retries: int = 0,
) -> None:
    """Run ``study`` with each trial in its own child process, at most ``n_jobs`` at a time: Optuna's
    ``study.optimize`` arguments, with processes instead of threads.

    For every trial the parent asks the study, has the guarded sampler check the whole assignment before
    launch (rejected trials end PRUNED without starting a process), reserves the prediction times the
    study's learned margin on this host's ledger (waiting while the host is full, or rejecting with
    ``on_host_full="reject"``), and starts the objective in a child forked from a server that has the
    objective's module imported (and torch, when this process has it loaded). The parent watches the
    child's process tree: over the soft line the child's pruner answers True at the next
    ``should_prune()``; over the budget the tree gets SIGTERM, then SIGKILL after ``GRACE_S``, and the
    trial ends PRUNED with the reading. Intermediate values and
    pruning go through the study's storage; the parent writes the record and the final state, so a child
    killed by the kernel or a crash ends FAIL with the reason and its constraints, never RUNNING.

    Notes:
        - The study needs a storage other processes can open (``sqlite:///file.db``, PostgreSQL, a
          journal file): an in-memory study cannot be shared with a child.
        - ``objective`` must be picklable: a module-level function (or a ``functools.partial`` of one).
          A script that calls ``optimize`` must guard its entry point with ``if __name__ == "__main__":``.
        - If this process is killed, its children die with it (the fork server exits and they get
          SIGKILL); the next runner on this host reaps its reservations, and the next runner of the same
          storage on this host fails its trials (those launched and those still being checked) with the
          reason. Until then ``memprune report`` shows them RUNNING with their runner dead. With an RDB
          storage that has heartbeats, workers on other hosts fail them as well.
        - A trial's end (record and state) is written as soon as its process ends; the footprint is not
          called again after a trial (a trial unchecked at launch keeps no prediction in its record).
        - Over several hosts: run ``optimize`` (or ``memprune worker``) on each with the same
          PostgreSQL storage; each host keeps its own ledger. Or, on a Ray cluster, ``backend="ray"``:
          one call whose trials Ray places on the cluster's nodes (see ``backend``).

    Args:
        study: the study. Its sampler need not be ``guard.wrap_sampler(...)``: a sampler no guard wraps is
            wrapped by ``guard`` for this call and put back after it (a study made with a plain sampler ran
            every trial unchecked, with a warning). Its pruner runs in each trial's process, where the soft
            line's answer is added to it; ``guard.wrap_pruner`` is for in-process studies.
        objective: ``trial -> value(s)``, run in the child.
        guard: the guard whose footprint, budget and policy apply.
        n_trials: trials this call runs, rejected ones included (None: until ``timeout`` or
            ``study.stop()``).
        timeout: seconds after which no new trial starts (running ones finish).
        n_jobs: children running at the same time, >= 1; -1 for this machine's CPU count (as Optuna's).
        catch: exception types of the objective that fail the trial and let the study go on; any other
            fails the trial and is raised once the running trials have finished. Running out of memory
            (``MemoryError``, torch's ``OutOfMemoryError``, the kernel's OOM killer) is neither: the trial
            ends PRUNED as infeasible (decision ``out_of_memory``) and the study goes on.
        callbacks: ``callback(study, frozen_trial)`` after each trial, in the parent.
        host: this host's budget (``HostBudget``, default ``HostBudget()``:
            all of the memory available now, less 10%) or a ``Ledger``
            (another host id or ledger database).
        on_host_full: ``"wait"`` (default) until the reservation fits, or ``"reject"`` the trial.
        show_progress_bar: show a progress bar (default: when stderr is a terminal).
        enforce: how a trial is held to its RAM budget. ``"auto"`` (default): a cgroup per trial where
            one can be made below this process's own group, else polling; ``"cgroup"``: a cgroup per trial
            or RuntimeError before any trial; ``"polling"``: the watchdog alone. In a group with a memory
            controller (cgroup v2 delegated, cgroup v1's memory controller) the kernel holds the tree's RSS
            to the budget exactly, even against an allocation faster than the poll: a trial killed at the
            limit ends PRUNED (stopped), "stopped by the kernel at its cgroup limit (N MiB)", with the
            group's exact peak. In a v2 group without one the tree is still killed whole. The watchdog
            polls in every mode (soft line, VRAM, threads); the record's ``enforcement`` says which applied.
        backend: where the trials run. ``"local"`` (default): a process per trial on this host, admitted by
            its ledger. ``"ray"`` (the ``ray`` extra): each trial a Ray task (a process of its own forked from
            the task's worker) on a node Ray chooses, asking for what the local runner would reserve (the
            prediction, or the learned bound, x the learned margin, capped by the budget) as ``memory=``
            (bytes), ``num_gpus=`` (its VRAM as a fraction of the cluster's smallest GPU, 0 without VRAM) and
            ``num_cpus=`` (its reserved threads where the budget limits threads, else 1); ``n_jobs`` tasks in
            flight at most (-1: the cluster's CPUs). Inside the task the trial runs under the same watchdog (polling:
            ``enforce`` must be ``"auto"`` or ``"polling"``); ``host`` and ``on_host_full`` are the local
            ledger's and must be left out. A trial no alive node can ever hold is rejected (PRUNED, the
            reason on its record) rather than left waiting; a trial whose node or worker dies ends FAIL with
            Ray's words, or PRUNED out of memory where Ray's memory monitor killed it. The storage must be
            one every node reaches (PostgreSQL; a SQLite or Journal file on a shared filesystem).
        ray_address: with ``backend="ray"``, the cluster: ``None`` (default) uses this process's connection
            where ``ray.init()`` was called, else ``ray.init()``'s default (``RAY_ADDRESS``, else a cluster
            ``ray start`` began on this machine, else a new one-machine cluster for this call); ``"local"``
            always a new one-machine cluster; ``"auto"`` a cluster already running on this machine;
            ``"HOST:PORT"`` or ``"ray://HOST:10001"`` (Ray Client) a remote one. A connection this call
            opened is closed when it returns.
        ray_retries: with ``backend="ray"``, how many times a trial whose task Ray lost is asked again with
            the same params (enqueued as Optuna's ``RetryFailedTrialCallback`` does: ``failed_trial``,
            ``retry_history``); each retry is one of the ``n_trials``. Default 0.
        n_workers: the old name of ``n_jobs``, kept for one release (a FutureWarning says so).
        progress: the old name of ``show_progress_bar``, kept for one release (a FutureWarning says so).

    Raises:
        ValueError: before any trial, for a bad argument, or a per-trial RAM budget over this machine's
            RAM (or its cgroup's limit). A budget within the machine but over the host's capacity is warned
            about: a trial unchecked at launch, which reserves its whole budget, reserves the host's capacity
            instead.
        LedgerError: the host ledger's database cannot be opened (the message names the file).
        RuntimeError: ``enforce="cgroup"`` where no cgroup can be made (the message says why).
    """
    if not isinstance(guard, MemoryGuard):
        raise TypeError(f"guard must be a MemoryGuard, but got {type(guard).__name__}.")
    if not isinstance(study, optuna.Study):
        raise TypeError(f"study must be an optuna.Study, but got {type(study).__name__}.")
    if not callable(objective):
        raise TypeError(f"objective must be callable, but got {type(objective).__name__}.")
    if isinstance(_internals.storage_of(study), optuna.storages.InMemoryStorage):
        raise ValueError(
            "optimize() runs each trial in its own process, which cannot open an in-memory "
            "study: create the study with a storage URL (sqlite:///file.db, postgresql+psycopg://...)."
        )
    n_jobs = _renamed("n_workers", n_workers, "n_jobs", n_jobs, 1)
    show_progress_bar = _renamed("progress", progress, "show_progress_bar", show_progress_bar, None)
    check_int(n_trials, "n_trials", minimum=0, optional=True)
    check_number(timeout, "timeout", minimum=0, optional=True)
    check_int(n_jobs, "n_jobs", minimum=-1)
    if n_jobs == 0:
        raise ValueError("n_jobs must be a positive int or -1 (this machine's CPU count), but got 0.")
    if on_host_full not in ("wait", "reject"):
        raise ValueError(f"on_host_full must be 'wait' or 'reject', but got {on_host_full!r}.")
    catch = (catch,) if isinstance(catch, type) else tuple(catch)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in catch):
        raise TypeError(f"catch must be exception types, but got {catch!r}.")
    callbacks = _check_callbacks(callbacks)
    if _check_backend(backend, ray_address, ray_retries, host=host, on_host_full=on_host_full, enforce=enforce):
        from ._ray import run_on_ray

        show = sys.stderr.isatty() if show_progress_bar is None else bool(show_progress_bar)
        run_on_ray(
            study,
            objective,
            guard,
            n_trials=n_trials,
            timeout=timeout,
            n_jobs=n_jobs,
            catch=catch,
            callbacks=callbacks,
            show=show,
            address=ray_address,
            retries=ray_retries,
        )
        return
    n_jobs = (os.cpu_count() or 1) if n_jobs == -1 else n_jobs
    enforcement = Enforcer(enforce, guard.budget, policy_of(guard).soft)
    from ..ledger import HostBudget, Ledger

    if host is None:
        host = HostBudget()
    if isinstance(host, HostBudget):
        ledger = Ledger(host)
    elif isinstance(host, Ledger):
        ledger = host
    else:
        raise TypeError(f"host must be a HostBudget, a Ledger or None, but got {type(host).__name__}.")
    try:
        over_host = check_budget_fits(guard.budget, ledger)
    except ValueError:
        if host is not ledger:
            ledger.close()
        raise
    if over_host:
        warnings_of(guard).once("budget-over-host", over_host)
    from ..ledger import describe

    _logger.info("Host %s: trials may reserve %s; %s.", ledger.host, describe(ledger.capacity), enforcement.describe())
    runner = Runner(
        study,
        objective,
        guard,
        ledger,
        n_trials=n_trials,
        timeout=timeout,
        n_workers=n_jobs,
        catch=catch,
        callbacks=callbacks,
        on_host_full=on_host_full,
        enforcement=enforcement,
    )
    show = sys.stderr.isatty() if show_progress_bar is None else bool(show_progress_bar)
    try:
        if show:
            with Progress(runner.status, n_trials) as bar:
                runner.run(bar.update)
        else:
            runner.run(None)
    finally:
        if host is not ledger:
            ledger.close()
        stop_fork_server()


def _check_backend(backend: Any, address: Any, retries: Any, *, host: Any, on_host_full: str, enforce: Any) -> bool:
    """Whether the trials run on Ray; ValueError for a backend that is neither, for Ray's arguments without
    it, and for the local ledger's arguments with it."""
    if backend not in ("local", "ray"):
        raise ValueError(
            "backend must be 'local' (a process per trial on this host) or 'ray' (a Ray task per trial), but got "
            f"{backend!r}."
        )
    if backend == "local":
        for name, value, default in (("ray_address", address, None), ("ray_retries", retries, 0)):
            if value != default:
                raise ValueError(f"{name}= is for backend='ray', but backend is 'local' (got {name}={value!r}).")
        return False
    if address is not None and (not isinstance(address, str) or not address):
        raise ValueError(
            "ray_address must be None, 'auto', 'HOST:PORT' or 'ray://HOST:PORT', but got "
            f"{type(address).__name__} {address!r}."
        )
    check_int(retries, "ray_retries", minimum=0)
    if host is not None:
        raise ValueError(
            "host= is the local runner's ledger; with backend='ray' the cluster admits each trial by its Ray "
            "resources: leave host out."
        )
    if on_host_full != "wait":
        raise ValueError(
            f"on_host_full={on_host_full!r} is the local runner's; with backend='ray' a trial waits for its "
            "resources, and one no node can ever hold is rejected: leave on_host_full out."
        )
    if enforce not in ("auto", "polling"):
        raise ValueError(
            f"enforce must be 'auto' or 'polling' with backend='ray' (a trial's own process in its Ray task is "
            f"held by polling), but got {enforce!r}."
        )
    return True


def _check_callbacks(callbacks: Any) -> list[Callable[[optuna.Study, FrozenTrial], None]]:
    """``callbacks``: None or a sequence of functions ``callback(study, frozen_trial)``, checked before any trial."""
    if callbacks is None:
        return []
    if callable(callbacks) or isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise TypeError(
            f"callbacks must be a list of functions callback(study, frozen_trial), but got "
            f"{type(callbacks).__name__} {callbacks!r}."
        )
    checked: list[Callable[[optuna.Study, FrozenTrial], None]] = list(callbacks)
    for i, callback in enumerate(checked):
        if not callable(callback):
            raise TypeError(
                f"callbacks must be a list of functions callback(study, frozen_trial), but "
                f"callbacks[{i}] is {type(callback).__name__} {callback!r}."
            )
    return checked


def _renamed(old: str, old_value: Any, new: str, new_value: Any, default: Any) -> Any:
    """The value of an argument renamed to Optuna's name: the new one, or the old one with a FutureWarning
    (kept for one release); both given is a TypeError."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise TypeError(f"optimize() got both {new}= and {old}=, its old name: give {new}= only.")
    warnings.warn(
        f"optimize({old}=) is renamed {new}= (Optuna's name); {old}= goes in the next release.",
        FutureWarning,
        stacklevel=3,
    )
    return old_value
