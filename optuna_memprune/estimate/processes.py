"""The process around the training: interpreter + imports baseline, torch threads, env worker processes.

Owns how calibrated figures (calibration.py) become Footprint components; knows nothing of Optuna or psutil.
"""

from __future__ import annotations

from typing import Iterable

from .calibration import Calibration, EnvProfile, load, sb3_imports
from .footprint import Component, Footprint, Kind

#: Import sets measured by ``memprune calibrate`` (others are measured on first use).
DEFAULT_STACKS: tuple[tuple[str, ...], ...] = (
    ("torch",),
    sb3_imports(atari=False),
    sb3_imports(atari=True),
)
#: Named stacks a user may pass instead of a tuple of module names.
STACKS = {
    "python": (),
    "torch": ("torch",),
    "sb3": DEFAULT_STACKS[1],
    "sb3-atari": DEFAULT_STACKS[2],
}


def _stack(stack: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(stack, str):
        if stack not in STACKS:
            raise ValueError(f"stack must be one of {sorted(STACKS)} or a tuple of module names, but got {stack!r}.")
        return STACKS[stack]
    mods = tuple(stack)
    if not all(isinstance(m, str) and m for m in mods):
        raise ValueError(f"stack must be module names, but got {stack!r}.")
    return mods


def process(
    stack: str | Iterable[str] = "torch",
    *,
    torch_threads: int | None = None,
    training: bool = True,
    extra_threads: int = 0,
    calibration: Calibration | None = None,
) -> Footprint:
    """The baseline of the trial's process, as measured on this host.

    Args:
        stack: what the process imports: ``"python"``, ``"torch"``, ``"sb3"``, ``"sb3-atari"``, or a tuple
            of module names. Measured once per environment (see ``memprune calibrate``).
        torch_threads: ``torch.set_num_threads`` of the trial; ``None`` means torch's default on this host.
        training: include the one-off cost of torch's first optimizer and backward (about 100 MB here).
        extra_threads: threads the user's code starts itself (data loaders in threads, loggers, ...).

    The baseline is the process's VmHWM after imports and a tiny training step at one torch thread; each
    further torch thread adds the measured thread count and RSS.
    """
    mods = _stack(stack)
    if torch_threads is not None and (isinstance(torch_threads, bool) or not isinstance(torch_threads, int)
                                      or torch_threads < 1):
        raise ValueError(f"torch_threads must be a positive int, but got {torch_threads!r}.")
    if isinstance(extra_threads, bool) or not isinstance(extra_threads, int) or extra_threads < 0:
        raise ValueError(f"extra_threads must be a non-negative int, but got {extra_threads!r}.")
    cal = calibration or load()
    base = cal.stack(mods, train=training)
    if "torch" not in mods:
        return Footprint((Component("interpreter + imports", Kind.BASELINE, base.ram, 0,
                                    max(1, base.threads_at(0)) + extra_threads,
                                    note="measured: " + (", ".join(mods) or "bare python")),))
    n = torch_threads or base.default_torch_threads
    threads_one = base.threads_at(1)
    parts = [Component("interpreter + imports", Kind.BASELINE, base.ram, 0, threads_one,
                       note=f"measured: {', '.join(mods)}" + (" + first training step" if base.train else ""))]
    if n > 1 or extra_threads:
        parts.append(Component(
            f"torch threads ({n})", Kind.THREADS, base.ram_per_torch_thread * (n - 1), 0,
            base.threads_at(n) - threads_one + extra_threads,
            note=f"{base.threads_per_torch_thread:.1f} OS threads per torch thread",
        ))
    return Footprint(tuple(parts))


def env_instances(profile: EnvProfile, n_envs: int) -> Footprint:
    """``n_envs`` instances of an environment living in the trial's own process (DummyVecEnv)."""
    ram = profile.first_env_ram + profile.env_ram * (n_envs - 1)
    return Footprint((Component(f"{profile.env_id} x{n_envs}", Kind.ENVIRONMENT, ram,
                                note="measured per instance"),))


def env_workers(profile: EnvProfile, n_workers: int) -> Footprint:
    """``n_workers`` SubprocVecEnv worker processes plus the helper processes multiprocessing starts."""
    return Footprint((
        Component(f"env worker processes x{n_workers}", Kind.WORKERS, profile.worker_ram * n_workers, 0,
                  profile.worker_threads * n_workers, n_workers, note="measured VmHWM per worker"),
        Component("multiprocessing helpers", Kind.WORKERS, profile.helper_ram, 0, profile.helper_threads,
                  profile.helper_processes, note="forkserver / resource tracker"),
    ))
