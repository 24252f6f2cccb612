"""``memprune run``'s injection: an unchanged Python program run with the guard inside it.

Design: the command is checked here (a Python interpreter, a ``.py`` file or a script with a python shebang;
anything else is refused), then the CLI replaces its own process with the program (``exec``), adding two
things to the environment: a directory holding only a ``sitecustomize.py`` put first on ``PYTHONPATH``, and
``MEMPRUNE_RUN`` (a small JSON: the budget, the footprint choice and the pid the hook is meant for, the
CLI's own pid, which ``exec`` keeps). Python imports ``sitecustomize`` at startup in every mode (``-m``, a
script, ``-c``, a console script), so nothing about how the program starts changes (``sys.argv``,
``__main__``, ``-m`` resolution stay Python's own). The hook (``_hook.py``) acts only in the process whose
pid is the one named, removes both additions from ``os.environ`` at once (so subprocesses, SubprocVecEnv
workers and multiprocessing spawn/forkserver children start clean), chains to the next ``sitecustomize``
on the path, and its patched functions check the pid again at each call (a forked child inherits them and
gets Optuna's originals).

Owns the command's classification, the environment, the footprint choice and its picklable footprints;
knows nothing of argparse or exit codes (the CLI's) and never prints (the hook prints in the program).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget import Budget
from ..guard.backend import MonitorOnly
from ._command import Program, python_command

#: The environment variable that carries the guard's options to the hook (removed by the hook at once).
ENV_VAR = "MEMPRUNE_RUN"
#: The directory put first on ``PYTHONPATH``: it holds ``sitecustomize.py`` only.
SITE_DIR = str(Path(__file__).resolve().parent / "site")
#: The footprint choices that are no ``MODULE:FUNCTION`` (a recipe's name is one too).
CHOICES = ("auto", "learned", "none")
#: Where ``--footprint auto`` finds a program's own footprint: a function of this name in its main module.
DECLARED = "memprune_footprint"
#: The rl-zoo3 recipe's name in ``estimate.recipes.RECIPES``.
RLZOO3 = "rlzoo3"

_LEARNED = "a footprint learned from the study's own trials (its first trials run unchecked under the monitor)"


@dataclass(frozen=True)
class Options:
    """What the CLI hands the hook: the budget (bytes and threads, ``None`` where unbudgeted), the policy and
    the ``--footprint`` choice, with the program it chose it for."""

    ram: int | None
    vram: int | None
    threads: int | None
    on_infeasible: str
    footprint: str
    program: Program
    workers: int = 1
    clamp_fixed: tuple[str, ...] = ()
    storage: str | None = None  # --storage: where a study the program makes in memory goes
    ray: str | None = None  # --ray: the Ray cluster's address, as ray.init() takes it ("local": a new one)

    @property
    def budget(self) -> Budget:
        return Budget(ram=self.ram, vram=self.vram, threads=self.threads)

    def environment(self, base: dict[str, str], pid: int) -> dict[str, str]:
        """``base`` with the hook added: ``SITE_DIR`` first on ``PYTHONPATH`` and ``MEMPRUNE_RUN`` for
        process ``pid`` (the hook puts ``PYTHONPATH`` back as it was)."""
        env = dict(base)
        old = env.get("PYTHONPATH")
        payload = {
            "pid": pid,
            "ram": self.ram,
            "vram": self.vram,
            "threads": self.threads,
            "on_infeasible": self.on_infeasible,
            "footprint": self.footprint,
            "program": [self.program.kind, self.program.target, list(self.program.args)],
            "workers": self.workers,
            "clamp_fixed": list(self.clamp_fixed),
            "storage": self.storage,
            "ray": self.ray,
            "pythonpath": old,
            "package": str(Path(__file__).resolve().parents[3]),
        }
        env["PYTHONPATH"] = SITE_DIR + (os.pathsep + old if old else "")
        env[ENV_VAR] = json.dumps(payload)
        return env

    @classmethod
    def from_environment(cls, payload: dict[str, Any]) -> Options:
        kind, target, args = payload["program"]
        return cls(
            payload["ram"],
            payload["vram"],
            payload["threads"],
            payload["on_infeasible"],
            payload["footprint"],
            Program((), kind, target, tuple(args)),
            int(payload.get("workers", 1)),
            tuple(payload.get("clamp_fixed", ())),
            payload.get("storage"),
            payload.get("ray"),
        )


def prepare(
    command: Sequence[str],
    *,
    ram: Any = None,
    vram: Any = None,
    threads: Any = None,
    on_infeasible: str = "clamp",
    footprint: str = "auto",
    workers: int = 1,
    clamp_fixed: Sequence[str] = (),
    storage: str | None = None,
    ray: str | None = None,
) -> tuple[Options, str]:
    """``memprune run``'s options checked before anything runs, and the footprint choice in words; ValueError
    (or TypeError) naming the bad one: a command that is not Python, no budget or one no guarded process
    fits in, ``workers`` below 1, a footprint that cannot be imported, ``clamp_fixed`` for a program that
    is no rl-zoo3 search guarded by its recipe, or a name it cannot lower, ``ray`` that names no cluster.

    Examples:
        >>> options, label = prepare(["python", "train.py"], ram="4GiB", footprint="none")
        >>> options.program.target, options.ram, label
        ('train.py', 4294967296, 'none: trials run unchecked under the monitor alone')
    """
    from ..guard import MemoryGuard
    from ..units import check_int

    program = python_command(command)
    budget = Budget(ram=ram, vram=vram, threads=threads)
    if not budget.resources:
        raise ValueError("give the budget: at least one of --ram, --vram, --threads")
    check_int(workers, "--workers", minimum=1)
    if ray is not None and (not isinstance(ray, str) or not ray):
        raise ValueError(
            f"--ray must be the cluster's address (auto, HOST:PORT, ray://HOST:10001, local), but got {ray!r}"
        )
    MemoryGuard(MonitorOnly("check"), budget, on_infeasible=on_infeasible)  # the soft line holds a process
    footprint = RLZOO3 if footprint == "rl-zoo3" else footprint  # the project's name, and the registry's
    label = check_choice(footprint, program)
    options = Options(
        budget.ram,
        budget.vram,
        budget.threads,
        on_infeasible,
        footprint,
        program,
        workers,
        tuple(clamp_fixed),
        storage,
        ray,
    )
    if clamp_fixed:
        overrides(options)  # checked now: a name the recipe cannot lower is one line before anything runs
    return options, label


def default_params(options: Options) -> tuple[str, Any] | None:
    """The recipe's title and the footprint of the program's default params, for an rl-zoo3 search that
    ``options`` guard with the rl-zoo3 recipe (``None`` otherwise)."""
    args = options.program.recipe_args
    if args is None or options.footprint not in ("auto", RLZOO3) or recipe(RLZOO3) is None:
        return None
    args = recipe_args(options, overrides(options))
    if args is None:
        return None
    title, footprint = RecipeFootprint(RLZOO3, args).build()
    return title, footprint({})


def rlzoo3_space(args: Sequence[str]) -> dict[str, Any]:
    """The search space of an rl-zoo3 search (``rl_zoo3.train ARGS``): the distributions its own sampler
    function for ``--algo`` suggests on a throwaway in-memory trial (no log line, no storage), so that the
    guard checks its first trial too. Params a sampler suggests only under a condition appear as drawn."""
    import argparse

    import optuna
    from rl_zoo3.hyperparams_opt import HYPERPARAMS_SAMPLER

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", default="ppo")
    algo = parser.parse_known_args(list(args))[0].algo
    storage = optuna.storages.InMemoryStorage()
    storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "memprune-space")
    study = optuna.Study("memprune-space", storage, sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    HYPERPARAMS_SAMPLER[algo](trial, 1, 1, {"using_her_replay_buffer": False, "her_kwargs": {}})
    return dict(trial.distributions)


def fixed_message(options: Options) -> str | None:
    """The rl-zoo3 recipe's word, before the first trial, on a fixed hyperparameter that makes every trial
    infeasible at this budget, with the largest value that fits (``recipe.fixed_message(args, budget)``,
    where the recipe defines it); ``None`` where there is nothing to say or no such recipe."""
    args = options.program.recipe_args
    module = recipe(RLZOO3) if args is not None and options.footprint in ("auto", RLZOO3) else None
    check = getattr(module, "fixed_message", None)
    if args is None or not callable(check):
        return None
    message: str | None = check(list(args), options.budget)
    return message


def overrides(options: Options) -> dict[str, tuple[Any, int]]:
    """``--clamp-fixed``'s overrides: ``{name: (the yml's value, the largest that fits under the soft line)}``
    for each named fixed hyperparameter that makes every trial infeasible (``recipe.clamp_fixed``); empty
    without ``--clamp-fixed``. ValueError for a program the rl-zoo3 recipe does not guard, or a name it
    cannot lower."""
    if not options.clamp_fixed:
        return {}
    args = options.program.recipe_args
    module = recipe(RLZOO3) if args is not None and options.footprint in ("auto", RLZOO3) else None
    if args is None or module is None or not callable(getattr(module, "clamp_fixed", None)):
        raise ValueError(
            "--clamp-fixed lowers the fixed hyperparameters of an rl-zoo3 search guarded by the rlzoo3 "
            f"recipe (python -m rl_zoo3.train ...), but the command is {options.program.target!r} "
            f"with --footprint {options.footprint}"
        )
    lowered: dict[str, tuple[Any, int]] = module.clamp_fixed(list(args), options.budget, list(options.clamp_fixed))
    return lowered


def replayed(options: Options) -> tuple[tuple[str, ...], str] | None:
    """For an rl-zoo3 command that replays a trial ``--clamp-fixed`` lowered fixed hyperparameters for: the
    command with them added to its ``-params``, and a line saying so (``_fixed.replay``); else ``None``."""
    from ._fixed import replay

    return replay(options.program.argv, options.program.recipe_args, recipe(RLZOO3))


def recipe_args(options: Options, fixed: dict[str, tuple[Any, int]]) -> tuple[str, ...] | None:
    """The rl-zoo3 arguments the recipe reads, with ``fixed``'s overrides as one last ``-params``."""
    args = options.program.recipe_args
    module = recipe(RLZOO3)
    if args is None or not fixed or module is None:
        return args
    return tuple(module.with_params(list(args), {k: v[1] for k, v in fixed.items()}))


# -- the footprint choice --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A ``--footprint`` resolved: ``footprint`` (what MemoryGuard calls; ``None``: learned from the study's
    trials) and ``label`` (in words); ``checked`` is False where trials run under the monitor alone."""

    footprint: Callable[[dict[str, Any]], Any] | None
    label: str
    checked: bool


def recipe(name: str) -> Any | None:
    """The recipe module ``name`` of ``estimate.recipes.RECIPES`` when it can guard a command (it defines
    ``for_command(args) -> (title, footprint)``), else ``None``."""
    from ..estimate.recipes import RECIPES

    module = RECIPES.get(name)
    return module if module is not None and callable(getattr(module, "for_command", None)) else None


def check_choice(spec: str, program: Program) -> str:
    """What ``--footprint spec`` will use for ``program``, in words, checked before the program runs:
    ValueError for a ``MODULE:FUNCTION`` that cannot be imported or is no function, or a recipe that is
    not available."""
    if spec in CHOICES:
        if spec == "none":
            return "none: trials run unchecked under the monitor alone"
        if spec == "learned":
            return f"learned: {_LEARNED}"
        args = program.recipe_args
        if args is not None:
            if recipe(RLZOO3) is not None:
                return f"auto: the {RLZOO3} recipe (estimate.recipes)"
            return (
                f"auto: the {RLZOO3} recipe is not available in this version of optuna-memprune, so trials "
                "run unchecked under the monitor alone"
            )
        return f"auto: the program's own {DECLARED}(params) if its main module defines one, else {_LEARNED}"
    if ":" not in spec:
        from ..estimate.recipes import RECIPES

        if spec in RECIPES:
            if recipe(spec) is None:
                raise ValueError(f"--footprint {spec!r}: the recipe cannot guard a command (it has no for_command)")
            return f"the {spec} recipe (estimate.recipes)"
        if spec == RLZOO3:
            raise ValueError(
                f"--footprint {RLZOO3}: the {RLZOO3} recipe is not available in this version of "
                "optuna-memprune (use --footprint auto to run under the monitor alone)"
            )
        raise ValueError(
            f"--footprint must be auto, learned, none, a recipe ({', '.join(RECIPES)}) or "
            f"MODULE:FUNCTION, but got {spec!r}"
        )
    function = ModuleFootprint(spec).load()
    if not callable(function):
        raise ValueError(f"--footprint {spec!r} is a {type(function).__name__}, not a function params -> Footprint")
    return f"{spec}"


def choose(spec: str, program: Program, main: Any = None, args: Sequence[str] | None = None) -> Choice:
    """``--footprint spec`` for ``program``, resolved in the program's process once it creates a study
    (``main``: its ``__main__`` module, where ``auto`` looks for ``memprune_footprint``; ``args``: the
    recipe's arguments where they differ from the program's, with ``--clamp-fixed``'s overrides)."""
    if spec == "none":
        return Choice(
            MonitorOnly("no footprint (--footprint none): the trial runs unchecked under the monitor"),
            "no footprint",
            False,
        )
    if spec == "learned":
        return Choice(None, _LEARNED, True)
    args = program.recipe_args if args is None else tuple(args)
    if spec == "auto":
        if args is not None:
            if recipe(RLZOO3) is not None:
                return Choice(RecipeFootprint(RLZOO3, args), f"the {RLZOO3} recipe", True)
            return Choice(
                MonitorOnly(
                    f"the {RLZOO3} recipe is not available in this version; the trial runs unchecked under the monitor"
                ),
                f"the {RLZOO3} recipe is not available: the monitor alone",
                False,
            )
        declared = getattr(main, DECLARED, None)
        if callable(declared):
            return Choice(declared, f"the program's {DECLARED}", True)
        return Choice(None, f"none declared: {_LEARNED}", True)
    if ":" not in spec:
        return Choice(RecipeFootprint(spec, args or program.args), f"the {spec} recipe", True)
    return Choice(ModuleFootprint(spec), spec, True)


def import_object(module: str, attr: str) -> Any:
    """``module.attr`` (dots allowed in ``attr``), the current directory on ``sys.path`` as for
    ``python -m``; the import's own exceptions (ImportError, AttributeError, what the module raises)."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class ModuleFootprint:
    """``MODULE:FUNCTION`` loaded at its first call (the program's directory is then on ``sys.path``); pickles
    as its spec."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._function: Callable[[dict[str, Any]], Any] | None = None

    def load(self) -> Any:
        """The object named (ValueError saying why it cannot be imported)."""
        module, _, attr = self.spec.partition(":")
        if not module or not attr:
            raise ValueError(f"--footprint must be written MODULE:FUNCTION, but got {self.spec!r}")
        try:
            return import_object(module, attr)
        except Exception as exc:  # noqa: BLE001 - an import that raises anything is the same failure
            raise ValueError(f"--footprint {self.spec!r} cannot be imported: {type(exc).__name__}: {exc}") from None

    def __call__(self, params: dict[str, Any]) -> Any:
        if self._function is None:
            self._function = self.load()
        return self._function(params)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "_function": None}


class RecipeFootprint:
    """A recipe's footprint for a command's arguments (``recipe.for_command(args)``), built at its first call;
    pickles as the recipe's name and the arguments."""

    def __init__(self, name: str, args: Sequence[str]) -> None:
        self.name, self.args = name, tuple(args)
        self._function: Callable[[dict[str, Any]], Any] | None = None

    def build(self) -> tuple[str, Callable[[dict[str, Any]], Any]]:
        """The recipe's title and footprint function for the arguments."""
        module = recipe(self.name)
        if module is None:
            raise ValueError(f"the {self.name} recipe is not available in this version")
        built: tuple[str, Callable[[dict[str, Any]], Any]] = module.for_command(list(self.args))
        return built

    def __call__(self, params: dict[str, Any]) -> Any:
        if self._function is None:
            self._function = self.build()[1]
        return self._function(params)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args, "_function": None}
