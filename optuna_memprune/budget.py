"""The per-trial Budget: RAM, VRAM and threads a trial may use.

Owns the validation of budgets; knows nothing of Optuna, torch or the OS.
"""

from __future__ import annotations

from dataclasses import dataclass

from .units import check_int, format_bytes, parse_bytes


@dataclass(frozen=True)
class Budget:
    """Per-trial limits; a resource left as ``None`` is unlimited. All numbers are bytes or counts.

    Sizes may be given in human form and are stored as ints.

    Example:
        >>> Budget(ram="6GiB", vram="10GiB", threads=16).ram
        6442450944
    """

    ram: int | None = None
    vram: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("ram", "vram"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_bytes(value, name=f"Budget.{name}"))
        check_int(self.threads, "Budget.threads", minimum=1, optional=True)

    @property
    def resources(self) -> dict[str, int]:
        """The budgeted resources only, e.g. ``{"ram": 6442450944, "threads": 16}``."""
        return {k: v for k in ("ram", "vram", "threads") if (v := getattr(self, k)) is not None}

    def __str__(self) -> str:
        parts = [f"{k}={v if k == 'threads' else format_bytes(v)}" for k, v in self.resources.items()]
        return f"Budget({', '.join(parts) or 'unlimited'})"
