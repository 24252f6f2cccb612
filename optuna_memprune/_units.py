"""Byte sizes ("6GiB", "512MB", "1.5 GB", ints) and the per-trial Budget.

Owns parsing and formatting of human sizes; knows nothing of Optuna, torch or the OS.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GiB = 1024**3
MiB = 1024**2


def parse_bytes(value: int | float | str, *, name: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts ints, integral floats (``1e9``) and strings such as ``"6GiB"``, ``"512MB"``, ``"1.5 GB"`` or
    ``"1024"``. Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers
    of 1024. Raises ``ValueError`` naming ``name`` and the text given when the value is not a size or is
    negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a byte size such as '6GiB' or an int, but got {value!r}.")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            raise ValueError(f"{name} must be a whole number of bytes, but got {value!r}.")
        number = int(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name} must be a byte size such as '6GiB', '512MB' or '1.5 GB', but got {value!r}."
            )
        number = int(round(float(match.group(1)) * _UNITS[unit]))
    else:
        raise ValueError(f"{name} must be a byte size such as '6GiB' or an int, but got {value!r}.")
    if number < 0:
        raise ValueError(f"{name} cannot be negative, but got {value!r}.")
    return number


def format_bytes(n: int | float) -> str:
    """Human form of a byte count in binary units: ``format_bytes(6 * 2**30) == '6.00 GiB'``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


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
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ValueError(f"Budget.threads must be a positive int, but got {t!r}.")

    @property
    def resources(self) -> dict[str, int]:
        """The budgeted resources only, e.g. ``{"ram": 6442450944, "threads": 16}``."""
        return {k: v for k in ("ram", "vram", "threads") if (v := getattr(self, k)) is not None}

    def __str__(self) -> str:
        parts = [f"{k}={v if k == 'threads' else format_bytes(v)}" for k, v in self.resources.items()]
        return f"Budget({', '.join(parts) or 'unlimited'})"
