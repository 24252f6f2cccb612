"""The per-trial Budget: RAM, VRAM and threads a trial may use.

Owns the validation of budgets (their floors and ceilings); knows nothing of Optuna, torch or the OS.
"""

from __future__ import annotations

from dataclasses import dataclass

from .units import MiB, check_bytes, check_int, format_bytes

#: The smallest RAM budget: an interpreter that has imported Optuna (every trial's process has) takes
#: about 40 MiB of RSS; bare CPython about 10 MiB. A budget below this stops every trial at once.
RAM_FLOOR = 32 * MiB
#: The smallest VRAM budget: the CUDA caching allocator reserves at least one 2 MiB segment for the first
#: tensor (``CUDACachingAllocator.cpp``, small pool); the CUDA context alone takes hundreds of MiB more.
VRAM_FLOOR = 2 * MiB
#: The most threads a budget may name: Linux caps pids (hence threads) at ``PID_MAX_LIMIT``, 2**22.
MAX_THREADS = 2**22

_FLOORS = {
    "ram": (RAM_FLOOR, "a Python process running an Optuna trial takes more"),
    "vram": (VRAM_FLOOR, "the smallest block the CUDA allocator reserves; leave vram unset for no VRAM budget"),
}


@dataclass(frozen=True, init=False)
class Budget:
    """Per-trial limits; a resource left as ``None`` is unlimited. All numbers are bytes or counts.

    Sizes may be given in human form and are stored as ints. A budget no process can run in is refused:
    ``ram`` below 32 MiB, ``vram`` below 2 MiB, fewer than 1 thread; so is a size beyond any machine
    (over 1 EiB) or more threads than Linux runs (2**22).

    Examples:
        >>> Budget(ram="6GiB", vram="10GiB", threads=16).ram
        6442450944
        >>> Budget(ram=1)
        Traceback (most recent call last):
        ...
        ValueError: Budget.ram must be at least 32 MiB (a Python process running an Optuna trial takes more), but got 1.
    """

    ram: int | None = None
    vram: int | None = None
    threads: int | None = None

    # Written out (not the dataclass's) so that type checkers take the sizes in human form too.
    def __init__(
        self, ram: int | float | str | None = None, vram: int | float | str | None = None, threads: int | None = None
    ) -> None:
        for name, value in (("ram", ram), ("vram", vram)):
            floor, why = _FLOORS[name]
            object.__setattr__(
                self,
                name,
                None if value is None else check_bytes(value, f"Budget.{name}", minimum=floor, why_minimum=why),
            )
        check_int(
            threads,
            "Budget.threads",
            minimum=1,
            maximum=MAX_THREADS,
            optional=True,
            expected=f"an int in [1, {MAX_THREADS}] (Linux runs no more threads)",
        )
        object.__setattr__(self, "threads", threads)

    @property
    def resources(self) -> dict[str, int]:
        """The budgeted resources only, e.g. ``{"ram": 6442450944, "threads": 16}``."""
        return {k: v for k in ("ram", "vram", "threads") if (v := getattr(self, k)) is not None}

    def __str__(self) -> str:
        parts = [f"{k}={v if k == 'threads' else format_bytes(v)}" for k, v in self.resources.items()]
        return f"Budget({', '.join(parts) or 'unlimited'})"


def soft_line(limit: int, soft: float, base: int = 0) -> int:
    """The soft line of a budget ``limit``: ``soft`` of it, or, above ``base`` (the usage a learned increment
    adds to), ``base`` plus ``soft`` of the budget above it, the margin being for what is predicted."""
    return int(soft * limit + (1 - soft) * min(max(base, 0), limit))
