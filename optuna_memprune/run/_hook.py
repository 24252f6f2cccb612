"""The code ``memprune run`` runs inside the guarded program: Optuna's study functions patched, and the
summary line at exit.

Owns what happens in the program's process: ``optuna.create_study`` / ``optuna.load_study`` give every study
a guarded sampler and pruner (the program's own, or Optuna's defaults; a study made in memory goes on
``--storage`` where one is given), ``Study.optimize`` a guarded objective (with ``n_jobs`` above 1 or
``--workers N``, handed to ``_split``: one process per trial, or threads under whole-process admission),
``--clamp-fixed``'s values set in rl-zoo3's manager, ``Study.ask`` outside ``optimize`` noted (such trials run
unguarded: said once and counted); one line per study on stderr when it is first guarded,
one saying how parallel jobs run, and one per study at exit. Every patched function gives Optuna's original
behaviour in any other process (a forked child inherits the patches). The only printing outside the CLI:
the program's process has no CLI to print for it. Knows nothing of the command line.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import sys
import threading
import time
from typing import Any

from .. import records
from ..storages import shown
from ..units import format_bytes
from . import ENV_VAR, Choice, Options, _split, choose, fixed_message, overrides, recipe_args, rlzoo3_space
from ._summary import location as _location
from ._summary import study_line

_STATE: _Injected | None = None


def install() -> None:
    """Install the guard in this process when ``MEMPRUNE_RUN`` names it; put the environment back as it was
    before ``memprune run`` so that no child process sees the hook. Never raises: a failure is one line and
    the program runs unguarded."""
    global _STATE
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return
    try:
        payload = json.loads(raw)
        if payload.get("pid") != os.getpid():
            return
        del os.environ[ENV_VAR]
        if payload.get("pythonpath") is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = payload["pythonpath"]
        _STATE = _Injected(Options.from_environment(payload), os.getpid())
        _STATE.patch()
    except Exception as exc:  # noqa: BLE001 - the program must run even when the hook cannot
        _STATE = None
        print(
            f"memprune: the guard could not be installed ({type(exc).__name__}: {exc}); the program runs unguarded",
            file=sys.stderr,
        )


class _Injected:
    """The guard's state in the program: the options, the studies it guarded and their trials."""

    def __init__(self, options: Options, pid: int) -> None:
        import optuna

        self.options, self.pid = options, pid
        self.budget = options.budget
        self.lock = threading.RLock()  # re-entered: guard_study asks a study of its own (rl-zoo3's space)
        self.choice: Choice | None = None
        self.guards: dict[int, Any] = {}  # id(study) -> its MemoryGuard
        self.studies: list[tuple[Any, Any, set[int]]] = []  # (study, guard, numbers of the trials run here)
        self.jobs_said = False
        self.fixed: dict[str, tuple[Any, int]] = {}  # --clamp-fixed: {name: (was, lowered to)}
        self.applied: set[int] = set()  # id() of the rl-zoo3 managers the overrides were set on
        self.shadows: dict[int, Any] = {}  # id(in-memory study) -> its copy on a journal file
        self.threads_why: dict[int, str] = {}  # id(study) -> why its parallel jobs stayed threads
        self.storage: Any = None  # --storage, opened at the first study it takes
        self.put_on_storage: set[int] = set()  # id() of the studies made in memory, put on --storage
        self.optuna = optuna
        self.originals = (optuna.create_study, optuna.load_study, optuna.Study.optimize, optuna.Study.ask)
        self.optimizing = 0  # guarded optimize calls running in this process (Optuna's own ask() is theirs)
        self.asked: dict[int, int] = {}  # id(study) -> trials the program made with ask() outside optimize

    def patch(self) -> None:
        optuna = self.optuna
        create, load, optimize, ask = self.originals
        state = self

        def create_study(*args: Any, **kwargs: Any) -> Any:
            if os.getpid() != state.pid:
                return create(*args, **kwargs)
            return state.guard_study(state.create(create, args, kwargs))

        def load_study(*args: Any, **kwargs: Any) -> Any:
            study = load(*args, **kwargs)
            return state.guard_study(study) if os.getpid() == state.pid else study

        def guarded_optimize(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            entry = state.adopt(self) if os.getpid() == state.pid else None
            if entry is None:
                return optimize(self, func, *args, **kwargs)
            state.apply_fixed(func)
            call = inspect.signature(optimize).bind(self, func, *args, **kwargs)
            call.apply_defaults()
            k = _split.jobs(call.arguments["n_jobs"], state.options.workers)
            with state.lock:
                state.optimizing += 1
            try:
                if k > 1 or state.options.ray is not None:  # --ray: every trial a Ray task, k at a time
                    return state.parallel(entry, func, k, call.arguments)
                return optimize(self, _Counted(entry[1].wrap_objective(func), entry[2]), *args, **kwargs)
            finally:
                with state.lock:
                    state.optimizing -= 1

        def noted_ask(self: Any, *args: Any, **kwargs: Any) -> Any:
            trial = ask(self, *args, **kwargs)
            if os.getpid() == state.pid and not state.optimizing and any(e[0] is self for e in state.studies):
                state.asked_outside(self, trial.number)
            return trial

        for name, function in (("create_study", create_study), ("load_study", load_study)):
            functools.update_wrapper(function, getattr(optuna, name))  # the original's name, doc, __wrapped__
            setattr(optuna, name, function)
            setattr(optuna.study, name, function)
        functools.update_wrapper(guarded_optimize, optimize)
        optuna.Study.optimize = guarded_optimize
        functools.update_wrapper(noted_ask, ask)
        optuna.Study.ask = noted_ask
        atexit.register(self.summary)

    def create(self, create: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``create_study(*args, **kwargs)``, on ``--storage`` where the program gives the study no storage (a
        study of that name already there, which the program does not ask to load, gets the time appended, as
        the program expects a new study); in memory, as asked, when the storage cannot be opened."""
        url = self.options.storage
        try:
            call = inspect.signature(create).bind(*args, **kwargs)
        except TypeError:  # the program's own mistake: Optuna's own error says it
            return create(*args, **kwargs)
        if url is None or call.arguments.get("storage") is not None:
            return create(*args, **kwargs)
        try:
            with self.lock:
                if self.storage is None:
                    from ..storages import open_storage
                    from ._attrs import json_attrs

                    self.storage = json_attrs(open_storage(url))
        except Exception as exc:  # noqa: BLE001 - the program runs on, with its study in memory
            print(
                f"memprune: --storage {shown(url)} cannot be opened ({type(exc).__name__}: {exc}); the study "
                "stays in memory",
                file=sys.stderr,
            )
            return create(*args, **kwargs)
        call.arguments["storage"] = self.storage
        try:
            study = create(*call.args, **call.kwargs)
        except self.optuna.exceptions.DuplicatedStudyError:
            name = call.arguments["study_name"]
            call.arguments["study_name"] = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            study = create(*call.args, **call.kwargs)
            print(
                f"memprune: --storage {shown(url)} has a study {name!r} already: this run's is {study.study_name!r}",
                file=sys.stderr,
            )
        self.put_on_storage.add(id(study))
        return study

    def guard_study(self, study: Any) -> Any:
        """The study with a guarded sampler and pruner (once; a program's own guard is left alone)."""
        from ..guard import GuardedSampler, MemoryGuard

        with self.lock:
            if id(study) in self.guards or isinstance(study.sampler, GuardedSampler):
                return study
            if self.choice is None:
                self._fixed_message()
                self.choice = choose(
                    self.options.footprint,
                    self.options.program,
                    sys.modules.get("__main__"),
                    recipe_args(self.options, self.fixed),
                )
            guard = MemoryGuard(
                self.choice.footprint,
                self.budget,
                on_infeasible=self.options.on_infeasible,
                search_space=self._search_space(),
            )
            if self.fixed:
                from ._fixed import Overriding

                base = Overriding(study.sampler, self.fixed)
            else:
                base = study.sampler
            study.sampler = guard.wrap_sampler(base)
            study.pruner = guard.wrap_pruner(study.pruner)
            self.guards[id(study)] = guard
            self.studies.append((study, guard, set()))
        print(
            f"memprune: guarding study {study.study_name!r}: budget {self.budget}, footprint: {self.choice.label}",
            file=sys.stderr,
        )
        return study

    def _search_space(self) -> dict[str, Any] | None:
        """rl-zoo3's search space where its recipe guards the search (its first trial is checked too)."""
        args = self.options.program.recipe_args
        if args is None or self.choice is None or not self.choice.checked:
            return None
        try:
            return rlzoo3_space(args)
        except Exception as exc:  # noqa: BLE001 - the first trial then runs unchecked, as it would anyway
            print(
                f"memprune: rl-zoo3's search space could not be read ({type(exc).__name__}: {exc}); its "
                "first trial runs unchecked",
                file=sys.stderr,
            )
            return None

    def _fixed_message(self) -> None:
        if self.options.clamp_fixed:
            try:
                self.fixed = overrides(self.options)
            except ValueError as exc:
                print(f"memprune: --clamp-fixed: {exc}; nothing is lowered", file=sys.stderr)
                return
            soft = 0.9 * self.budget.ram if self.budget.ram else None
            for name in self.options.clamp_fixed:
                if name in self.fixed:
                    was, ran = self.fixed[name]
                    print(
                        f"memprune: --clamp-fixed: {name} {was} -> {ran} on every trial (the largest value that "
                        f"fits under the soft line, {format_bytes(int(soft or 0))}), recorded on each trial as "
                        f"{records.OVERRIDES}; replay a trial as it ran with -params {name}:{ran}",
                        file=sys.stderr,
                    )
                else:
                    print(f"memprune: --clamp-fixed: {name} fits as it is; nothing lowered", file=sys.stderr)
            return
        message = fixed_message(self.options)
        if message:
            print(f"memprune: {message}", file=sys.stderr)

    def apply_fixed(self, objective: Any) -> None:
        """Set ``--clamp-fixed``'s values in the rl-zoo3 manager whose bound ``objective`` the search runs (its
        fixed hyperparameters, which every trial copies; they travel with it into a trial's process)."""
        if not self.fixed:
            return
        manager = getattr(objective, "__self__", None)
        fixed = getattr(manager, "_hyperparams", None)
        if id(manager) in self.applied:
            return
        if not isinstance(fixed, dict) or not all(name in fixed for name in self.fixed):
            print(
                f"memprune: --clamp-fixed could not set {sorted(self.fixed)} in the objective "
                f"{getattr(objective, '__qualname__', objective)!r} (not rl-zoo3's ExperimentManager.objective): "
                "its trials run with the program's values, predicted with the lowered ones",
                file=sys.stderr,
            )
            return
        for name, (_, ran) in self.fixed.items():
            fixed[name] = ran
        self.applied.add(id(manager))

    def parallel(self, entry: tuple[Any, Any, set[int]], func: Any, k: int, call: dict[str, Any]) -> Any:
        """``optimize`` with ``k`` jobs: one process per trial through the runner where the objective and
        the program allow it, else threads of this process with whole-process admission; one line says which."""
        study, guard, numbers = entry
        why, objective = None, None
        try:
            objective = _split.transport(func)
        except Exception as exc:  # noqa: BLE001 - any failure to pickle means the threads' way
            why = f"the objective cannot be sent to another process: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            why = _split.unsendable(
                getattr(study.sampler, "base_sampler", study.sampler), "sampler"
            ) or _split.unsendable(getattr(study.pruner, "wrapped_pruner", study.pruner), "pruner")
            objective = None if why else objective
        if objective is None:
            self.threads_why[id(study)] = f"n_jobs={k} ran as threads ({why})"
            return self._threads(entry, func, k, call, why or "")
        from ..paths import cache_dir, writable_dir
        from ..runner import optimize as run_trials

        shared = _split.shared_study(study, writable_dir(cache_dir() / "runs"))
        where = (
            f"a journal file made for the in-memory study: {shared.path}"
            if shared.path is not None
            else f"the study's storage {shown(_location(study) or '')}"
        )
        ray, sent = self.options.ray, f"({k} at a time; the objective sent by {objective.by})"
        print(
            f"memprune: {k} jobs run as one process per trial {sent}, each with its own budget ({self.budget}) "
            f"reserved on this host's ledger, on {where}"
            if ray is None
            else f"memprune: trials run as Ray tasks on the cluster at {ray} {sent}, each asking Ray for its "
            f"reservation within its own budget ({self.budget}), on {where}",
            file=sys.stderr,
        )
        start = len(shared.study.get_trials(deepcopy=False))
        if shared.path is not None:
            self.shadows[id(study)] = shared.study
        if ray is None:  # this host's trial processes read it from a file, not each a copy through a pipe
            objective.spool()
        try:
            run_trials(
                shared.study,
                objective,
                guard=guard,
                n_trials=call["n_trials"],
                timeout=call["timeout"],
                n_jobs=k,
                catch=call["catch"],
                callbacks=call["callbacks"],
                backend="local" if ray is None else "ray",
                ray_address=ray,
            )
        finally:
            objective.unspool()
            numbers.update(t.number for t in shared.study.get_trials(deepcopy=False)[start:])
            _split.copy_back(shared, study)

    def _threads(self, entry: tuple[Any, Any, set[int]], func: Any, k: int, call: dict[str, Any], why: str) -> Any:
        from ..guard.backend import policy_of

        study, guard, numbers = entry
        line = policy_of(guard).limits.get("ram")
        objective = guard.wrap_objective(func)
        if line is not None:
            objective = _split.Gate(objective, guard, line)
            print(f"memprune: {_split.whole_process_words(k, why, line)}", file=sys.stderr)
        else:
            self.say_jobs(k)
        arguments = {name: value for name, value in call.items() if name not in ("self", "func")}
        return self.originals[2](study, _Counted(objective, numbers), **{**arguments, "n_jobs": k})

    def entry(self, study: Any) -> tuple[Any, Any, set[int]] | None:
        with self.lock:
            for entry in self.studies:
                if entry[0] is study:
                    return entry
        return None

    def adopt(self, study: Any) -> tuple[Any, Any, set[int]] | None:
        """The entry of ``study`` as ``optimize`` is called on it, guarded now where the program made it
        without ``create_study`` or ``load_study``: a ``Study`` of its own, as optuna-integration's
        ``LightGBMTuner`` makes one per step on the tuner's study (one on the storage and name of a guarded
        study shares its guard and trials; another gets its own), and its sampler and pruner guarded again
        where the program replaced them (the tuner sets each step's sampler). None: a program's own guard."""
        from .. import _internals
        from ..guard import GuardedPruner, GuardedSampler

        entry = self.entry(study)
        if entry is None:
            with self.lock:
                storage, where = _internals.storage_of(study), _location(study)
                for program_study, guard, numbers in self.studies:
                    if program_study.study_name == study.study_name and (
                        _internals.storage_of(program_study) is storage
                        or (where is not None and where == _location(program_study))
                    ):
                        entry = (study, guard, numbers)
                        self.guards[id(study)] = guard
                        self.studies.append(entry)
                        break
            if entry is None:
                entry = self.entry(self.guard_study(study))
        if entry is None:
            return None  # the program guards it itself
        if not isinstance(study.sampler, GuardedSampler):
            study.sampler = entry[1].wrap_sampler(study.sampler)
        if not isinstance(study.pruner, GuardedPruner):
            study.pruner = entry[1].wrap_pruner(study.pruner)
        return entry

    def say_jobs(self, n_jobs: int) -> None:
        with self.lock:
            if self.jobs_said:
                return
            self.jobs_said = True
        print(
            f"memprune: n_jobs={n_jobs} runs trials as threads of one process, so the budget ({self.budget}) "
            "is the whole process's: each trial is admitted on its own prediction, and a breach stops every "
            "trial running in it",
            file=sys.stderr,
        )

    def asked_outside(self, study: Any, number: int) -> None:
        """The program made trial ``number`` of a guarded study with ``ask()`` outside ``optimize``: no objective
        to wrap, no point to reject or stop it at. Said once; counted in the summary."""
        with self.lock:
            first = not self.asked
            self.asked[id(study)] = self.asked.get(id(study), 0) + 1
        if first:
            print(
                f"memprune: trial {number} of study {study.study_name!r} was made with study.ask(), outside "
                "study.optimize: memprune guards the trials study.optimize runs (it wraps their objective), so "
                "the trials an ask-and-tell loop makes run unguarded (no prediction, no stop, no record)",
                file=sys.stderr,
            )

    def summary(self) -> None:
        """One line per guarded study (or one saying there was none), on stderr, at the program's exit."""
        if os.getpid() != self.pid:
            return
        if not self.studies:
            print("memprune: the program created no Optuna study; nothing was guarded", file=sys.stderr)
            return
        seen = set()
        for program_study, _, numbers in self.studies:
            study = self.shadows.get(id(program_study), program_study)
            key = (study.study_name, _location(study))
            if key in seen:
                continue
            seen.add(key)
            try:
                line = study_line(study, numbers, self.choice, id(study) in self.put_on_storage)
            except Exception as exc:  # noqa: BLE001 - the storage may be gone at exit
                line = f"study {study.study_name!r}: its trials cannot be read back ({type(exc).__name__}: {exc})"
            if id(program_study) in self.threads_why:
                line += f"; {self.threads_why[id(program_study)]}"
            if asked := self.asked.get(id(program_study), 0):
                line += f"; {asked} trials made with study.ask() outside study.optimize ran unguarded"
            print(f"memprune: {line}", file=sys.stderr)


class _Counted:
    """The guarded objective, noting which trials this process ran (the summary counts those only)."""

    def __init__(self, objective: Any, numbers: set[int]) -> None:
        self._objective, self._numbers = objective, numbers

    def __call__(self, trial: Any) -> Any:
        self._numbers.add(trial.number)
        return self._objective(trial)
