"""The process around the training: interpreter + imports baseline, torch threads, env worker processes.

Owns how calibrated figures become Footprint components; knows nothing of Optuna, psutil or any recipe.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ..exceptions import EstimateError
from .baselines import EnvProfile
from .calibration import Calibration, load
from .checks import check_count
from .footprint import Component, Footprint, Kind


class Stack(NamedTuple):
    """What a process imports (module names) and the libraries (distributions) whose versions key its
    calibrated baseline: a recipe names its stacks with these."""

    imports: tuple[str, ...]
    versioned: tuple[str, ...] = ()


#: Stacks every process may name (recipes add their own: see ``recipes.process``).
STACKS = {
    "python": Stack(()),
    "torch": Stack(("torch",)),
}


def _stack(stack: str | Iterable[str] | Stack) -> Stack:
    if isinstance(stack, Stack):
        return stack
    if isinstance(stack, str):
        if stack not in STACKS:
            raise EstimateError(f"stack must be one of {sorted(STACKS)} or a tuple of module names, but got {stack!r}.")
        return STACKS[stack]
    mods = tuple(stack)
    if not all(isinstance(m, str) and m for m in mods):
        raise EstimateError(f"stack must be module names, but got {stack!r}.")
    return Stack(mods)


def process(
    stack: str | Iterable[str] | Stack = "torch",
    *,
    torch_threads: int | None = None,
    training: bool = True,
    extra_threads: int = 0,
    calibration: Calibration | None = None,
) -> Footprint:
    """The baseline of the trial's process, as measured on this host.

    Args:
        stack: what the process imports: ``"python"``, ``"torch"``, a tuple of module names, or a
            ``Stack`` (``recipes.process`` also takes the recipes' stack names, ``"sb3"``, ...).
            Measured once per environment (see ``memprune calibrate``).
        torch_threads: ``torch.set_num_threads`` of the trial; ``None`` means torch's default on this host.
        training: include the one-off cost of torch's first optimizer and backward (about 100 MB here).
        extra_threads: threads the user's code starts itself (data loaders in threads, loggers, ...).

    The baseline is the process's VmHWM after imports and a tiny training step at one torch thread; each
    further torch thread adds the measured thread count and RSS.
    """
    mods, versioned = _stack(stack)
    check_count(torch_threads, "torch_threads", "processes", optional=True)
    check_count(extra_threads, "extra_threads", "processes", minimum=0)
    cal = calibration or load()
    base = cal.stack(mods, train=training, versioned=versioned)
    if "torch" not in mods:
        return Footprint(
            (
                Component(
                    "interpreter + imports",
                    Kind.BASELINE,
                    base.ram,
                    0,
                    max(1, base.threads_at(0)) + extra_threads,
                    note="measured: " + (", ".join(mods) or "bare python"),
                ),
            )
        )
    n = torch_threads or base.default_torch_threads
    threads_one = base.threads_at(1)
    parts = [
        Component(
            "interpreter + imports",
            Kind.BASELINE,
            base.ram,
            0,
            threads_one,
            note=f"measured: {', '.join(mods)}" + (" + first training step" if base.train else ""),
        )
    ]
    if n > 1 or extra_threads:
        parts.append(
            Component(
                f"torch threads ({n})",
                Kind.THREADS,
                base.ram_per_torch_thread * (n - 1),
                0,
                base.threads_at(n) - threads_one + extra_threads,
                note=f"{base.threads_per_torch_thread:.1f} OS threads per torch thread",
            )
        )
    return Footprint(tuple(parts))


def env_instances(profile: EnvProfile, n_envs: int) -> Footprint:
    """``n_envs`` instances of an environment living in the trial's own process (DummyVecEnv)."""
    ram = profile.first_env_ram + profile.env_ram * (n_envs - 1)
    return Footprint((Component(f"{profile.env_id} x{n_envs}", Kind.ENVIRONMENT, ram, note="measured per instance"),))


def env_workers(profile: EnvProfile, n_workers: int) -> Footprint:
    """``n_workers`` SubprocVecEnv worker processes plus the helper processes multiprocessing starts."""
    return Footprint(
        (
            Component(
                f"env worker processes x{n_workers}",
                Kind.WORKERS,
                profile.worker_ram * n_workers,
                0,
                profile.worker_threads * n_workers,
                n_workers,
                note="measured VmHWM per worker",
            ),
            Component(
                "multiprocessing helpers",
                Kind.WORKERS,
                profile.helper_ram,
                0,
                profile.helper_threads,
                profile.helper_processes,
                note="forkserver / resource tracker",
            ),
        )
    )
