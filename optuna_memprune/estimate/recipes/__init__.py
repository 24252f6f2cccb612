"""The recipe registry: ready footprints for training stacks, one module each (``recipes.sb3(...)``).

Owns the list of recipes and what is read across them (CLI, stack names, calibration); knows nothing of Optuna.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from importlib.util import find_spec
from types import ModuleType

from ...exceptions import EstimateError
from ..baselines import EnvProfile
from ..calibration import Calibration, load
from ..footprint import Footprint
from ..processes import STACKS as PROCESS_STACKS
from ..processes import Stack
from ..processes import process as _process
from . import rlzoo3 as rlzoo3_recipe
from . import sb3 as sb3_recipe
from .rlzoo3 import rlzoo3
from .sb3 import ALGOS as SB3_ALGOS
from .sb3 import sb3

__all__ = ["sb3", "rlzoo3", "SB3_ALGOS", "RECIPES", "process", "stacks", "calibrate"]

# A recipe is one module of this package that exports its estimate function and what the registry reads:
#   HELP                      one line for ``memprune predict --help``
#   add_arguments(parser)     its options of ``memprune predict <name>`` (params come as name=value words)
#   from_args(args, params)   a title line and the Footprint, from the parsed options and params
#   STACKS                    {name: processes.Stack}: the import stacks its processes load (``process()``
#                             takes the names; ``memprune calibrate`` measures them)
#   VERSIONED                 the libraries (distributions) whose versions key its calibrated entries
#   calibrate_env(env_id, calibration)   optional: what ``memprune calibrate --env`` measures
#   check_env(env_id)         with calibrate_env: EstimateError for an env id it cannot profile (no probe run)
# Adding a recipe: its module, one line in RECIPES, its tests.

#: The recipes, by the name ``memprune predict <name>`` takes.
RECIPES: dict[str, ModuleType] = {"sb3": sb3_recipe, "rlzoo3": rlzoo3_recipe}


def stacks() -> dict[str, Stack]:
    """Every stack a process may name: ``"python"``, ``"torch"`` and each recipe's (``"sb3"``, ...)."""
    out = dict(PROCESS_STACKS)
    for recipe in RECIPES.values():
        out.update(recipe.STACKS)
    return out


def process(
    stack: str | Iterable[str] | Stack = "torch",
    *,
    torch_threads: int | None = None,
    training: bool = True,
    extra_threads: int = 0,
    calibration: Calibration | None = None,
) -> Footprint:
    """The baseline of the trial's process, as measured on this host (``processes.process``), where
    ``stack`` may also name a recipe's stack: ``"sb3"``, ``"sb3-atari"``, ``"rlzoo3"``, ``"rlzoo3-atari"``.

    Examples:
        >>> fp = process("sb3-atari", torch_threads=2)   # doctest: +SKIP
    """
    if isinstance(stack, str):
        named = stacks()
        if stack not in named:
            raise EstimateError(f"stack must be one of {sorted(named)} or a tuple of module names, but got {stack!r}.")
        stack = named[stack]
    return _process(
        stack, torch_threads=torch_threads, training=training, extra_threads=extra_threads, calibration=calibration
    )


def calibrate(*, env_ids: Sequence[str] = (), force: bool = False) -> tuple[Calibration, list[EnvProfile], float]:
    """Measure now torch's stack and every recipe's (those importable here), the CPU kernels (with torch),
    and each of ``env_ids`` with every recipe that profiles envs.

    Returns the calibration, the env profiles and the seconds it took; ``force`` forgets the cache first. An env
    id no recipe can profile is an ``EstimateError`` before anything is measured.
    """
    start = time.perf_counter()
    profilers = [recipe for recipe in RECIPES.values() if hasattr(recipe, "calibrate_env")]
    for env_id in env_ids:
        for recipe in profilers:
            recipe.check_env(env_id)
    cal = load()
    if force:
        cal.forget()
    wanted = [PROCESS_STACKS["torch"]] + [s for recipe in RECIPES.values() for s in recipe.STACKS.values()]
    wanted = [stack for stack in wanted if all(find_spec(m) is not None for m in stack.imports)]
    # Twice: a stack whose cached baseline the recheck finds drifted drops every entry measured before it, those
    # this loop read a moment earlier included (the recheck runs at the first read, or at a later one where
    # another process held the file's recheck lock then); the second pass measures them again, reading the rest.
    for stack in wanted + wanted:
        cal.stack(stack.imports, versioned=stack.versioned)
    if find_spec("torch") is not None:
        cal.cpu_kernels()
    profiles = [recipe.calibrate_env(env_id, cal) for env_id in env_ids for recipe in profilers]
    return cal, profiles, time.perf_counter() - start
