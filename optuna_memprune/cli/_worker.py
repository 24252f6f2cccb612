"""``memprune worker``: one host's workers of a study on a shared storage (``omp.optimize`` with a guard
given as ``--guard module:name`` or ``--footprint module:name`` with a budget), everything checked before
the study is created.

Part of the CLI layer; knows nothing of the other subcommands.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import MemPruneError
from ..storages import open_storage
from ._common import UsageError, load, storage_url

if TYPE_CHECKING:
    import optuna
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler


def cmd_worker(args: argparse.Namespace) -> int:
    import optuna

    import optuna_memprune as omp

    from ..ledger import HostBudget, Ledger, check_ledger_url
    from ..runner import check_budget_fits
    from ..units import check_int, check_number

    # Everything is checked before the study is created: a bad command line leaves nothing in the storage.
    url = storage_url(args)
    try:
        for name, value in (("--n-trials", args.n_trials), ("--n-workers", args.n_workers)):
            if value is not None:
                check_int(value, name, minimum=1 if name == "--n-workers" else 0)
        if args.timeout is not None:
            check_number(args.timeout, "--timeout", minimum=0, expected="a non-negative number of seconds")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.guard and args.footprint:
        raise UsageError(
            "give either --guard (a MemoryGuard with its budget) or --footprint with --ram/--vram/--threads, not both"
        )
    if args.ray is not None:
        return _ray_worker(args, url)
    if args.ray_retries:
        raise UsageError("--ray-retries is for --ray: give the cluster's address")
    if args.host_id is not None and not 0 < len(args.host_id) <= 255:
        raise UsageError(f"--host-id must be a non-empty name of at most 255 characters, but got {args.host_id!r}")
    if args.ledger is not None:
        try:
            check_ledger_url(args.ledger)
        except ValueError as exc:
            raise UsageError(f"--ledger: {exc}") from None
    objective = _objective_of(args)
    guard = _guard_of(args)
    try:
        host = HostBudget(
            ram=None if args.host_ram == "none" else args.host_ram,
            gpus=args.host_gpus,
            headroom=args.headroom,
            threads=args.host_threads,
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    ledger = Ledger(host, url=args.ledger, host=args.host_id)  # LedgerError: one line naming the file
    try:
        check_budget_fits(guard.budget, ledger)
    except ValueError as exc:
        ledger.close()
        raise UsageError(str(exc)) from None
    samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    pruners = {"median": optuna.pruners.MedianPruner, "none": optuna.pruners.NopPruner}
    try:
        study = _worker_study(args, url, guard, samplers, pruners)
    except BaseException:
        ledger.close()
        raise
    try:
        omp.optimize(
            study,
            objective,
            guard=guard,
            n_trials=args.n_trials,
            timeout=args.timeout,
            n_jobs=args.n_workers,
            host=ledger,
            on_host_full=args.on_host_full,
            show_progress_bar=args.progress,
            enforce=args.enforce,
        )
    finally:
        ledger.close()
    return 0


def _objective_of(args: argparse.Namespace) -> Any:
    """The objective named ``module:function``, checked to take one trial."""
    objective = load(args.objective, "the objective")
    if not callable(objective) or not _takes(objective, 1):
        what = _kind(objective) if not callable(objective) else "a function that does not take one trial"
        raise UsageError(
            f"the objective {args.objective!r} is {what}: give the module:function that takes a "
            "trial and returns its value"
        )
    return objective


def _guard_of(args: argparse.Namespace) -> Any:
    """The guard: ``--guard``, or ``--footprint`` with the budget."""
    import optuna_memprune as omp

    if args.guard:
        return _worker_guard(args.guard, omp.MemoryGuard)
    if args.footprint:
        try:
            budget = omp.Budget(ram=args.ram, vram=args.vram, threads=args.threads)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
        footprint = load(args.footprint, "--footprint")
        try:
            return omp.MemoryGuard(footprint, budget, on_infeasible=args.on_infeasible)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--footprint {args.footprint!r}: {exc}") from exc
    raise UsageError("give the guard: --guard module:name, or --footprint module:name with --ram/--vram/--threads")


#: This host's options, which --ray leaves to the cluster: (option, its attribute, its default).
_HOST_OPTIONS = (
    ("--host-id", "host_id", None),
    ("--ledger", "ledger", None),
    ("--host-ram", "host_ram", "auto"),
    ("--host-gpus", "host_gpus", "auto"),
    ("--host-threads", "host_threads", None),
    ("--headroom", "headroom", 0.1),
    ("--on-host-full", "on_host_full", "wait"),
)


def _ray_worker(args: argparse.Namespace, url: str) -> int:
    """``memprune worker --ray ADDRESS``: the study's trials as Ray tasks on that cluster
    (``omp.optimize(backend="ray")``); this host's ledger options do not apply."""
    import optuna

    import optuna_memprune as omp

    from ..units import check_int

    given = [name for name, attr, default in _HOST_OPTIONS if getattr(args, attr) != default]
    if given:
        raise UsageError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for this host's ledger; with --ray the "
            "cluster admits each trial by its Ray resources: leave them out"
        )
    if args.enforce == "cgroup":
        raise UsageError("--enforce cgroup is for this host's processes; a trial in a Ray task is held by polling")
    if not args.ray:
        raise UsageError("--ray needs the cluster's address: auto, HOST:PORT, ray://HOST:10001, or local")
    try:
        check_int(args.ray_retries, "--ray-retries", minimum=0)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    objective = _objective_of(args)
    guard = _guard_of(args)
    samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    pruners = {"median": optuna.pruners.MedianPruner, "none": optuna.pruners.NopPruner}
    study = _worker_study(args, url, guard, samplers, pruners)
    omp.optimize(
        study,
        objective,
        guard=guard,
        n_trials=args.n_trials,
        timeout=args.timeout,
        n_jobs=args.n_workers,
        show_progress_bar=args.progress,
        enforce=args.enforce,
        backend="ray",
        ray_address=args.ray,
        ray_retries=args.ray_retries,
    )
    return 0


def _worker_study(
    args: argparse.Namespace,
    url: str,
    guard: Any,
    samplers: Mapping[str, Callable[..., BaseSampler]],
    pruners: Mapping[str, Callable[[], BasePruner]],
) -> optuna.Study:
    """The worker's study, created or loaded; an existing study whose direction is not ``--direction`` is
    refused (it is loaded, so nothing is created)."""
    import optuna

    try:
        storage = open_storage(url)
        if args.direction is not None:
            _check_direction(storage, args.study, args.direction)
        study = optuna.create_study(
            storage=storage,
            study_name=args.study,
            direction=args.direction,
            load_if_exists=True,
            sampler=guard.wrap_sampler(samplers[args.sampler](seed=args.seed)),
            pruner=guard.wrap_pruner(pruners[args.pruner]()),
        )
    except UsageError:
        raise
    except (TypeError, ValueError, ImportError) as exc:
        raise MemPruneError(str(exc)) from exc
    except Exception as exc:  # the storage's own errors (unreachable server, bad URL)
        raise MemPruneError(
            f"could not open study {args.study!r} in {url}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    return study


def _check_direction(storage: Any, name: str, direction: str) -> None:
    """``--direction`` must be an existing study's own (a study that does not exist yet takes it)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return
    directions = [d.name.lower() for d in storage.get_study_directions(study_id)]
    if directions != [direction]:
        raise UsageError(
            f"--direction {direction} disagrees with study {name!r}, which is {', '.join(directions)}: "
            "leave --direction out to run the study as it is"
        )


def _kind(obj: Any) -> str:
    """``a module``, ``an int``: what a module:name turned out to be."""
    import inspect

    name = "module" if inspect.ismodule(obj) else type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _takes(function: Any, n: int) -> bool:
    """Whether ``function`` can be called with ``n`` positional arguments (True where no signature is known)."""
    import inspect

    try:
        inspect.signature(function).bind(*[None] * n)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): calling it will say
        pass
    return True


def _worker_guard(spec: str, guard_type: type) -> Any:
    """``--guard module:name``: a MemoryGuard, or a function of no arguments that returns one."""
    guard = load(spec, "--guard")
    if isinstance(guard, guard_type):
        return guard
    if not callable(guard):
        raise UsageError(
            f"--guard {spec!r} is {_kind(guard)}: give a MemoryGuard, or a function of no arguments that returns one"
        )
    if not _takes(guard, 0):
        raise UsageError(
            f"--guard {spec!r} is a function that takes arguments (a footprint function? give it as "
            "--footprint with --ram/--vram/--threads): --guard takes a MemoryGuard, or a function "
            "of no arguments that returns one"
        )
    try:
        guard = guard()
    except Exception as exc:  # noqa: BLE001 - the user's function; one line says what it raised
        raise MemPruneError(f"--guard {spec!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(guard, guard_type):
        raise UsageError(f"--guard {spec!r} returned {_kind(guard)}, not a MemoryGuard")
    return guard
