"""Footprint and Component: the predicted peak RAM, VRAM, threads and processes of one trial, by part.

Plain data with arithmetic and a breakdown table; knows nothing of how the parts were estimated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ..units import format_bytes, parse_bytes
from .checks import check_int


class Kind(str, Enum):
    """What a component is; the values double as table headings."""

    WEIGHTS = "weights"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    BUFFER = "buffer"
    ENVIRONMENT = "environments"
    BASELINE = "baseline"
    THREADS = "threads"
    WORKERS = "workers"
    CUDA_CONTEXT = "cuda context"
    ALLOCATOR = "allocator overhead"
    USER = "user"
    OTHER = "other"


@dataclass(frozen=True)
class Component:
    """One named part of a footprint. All numbers are bytes except ``threads`` and ``processes``.

    ``ram`` and ``vram`` are the part's contribution to the peak; ``processes`` counts extra OS processes
    (env workers, DataLoader workers) the part starts.
    """

    name: str
    kind: Kind = Kind.OTHER
    ram: int = 0
    vram: int = 0
    threads: int = 0
    processes: int = 0
    note: str = ""

    def __post_init__(self) -> None:
        for attr in ("ram", "vram", "threads", "processes"):
            check_int(getattr(self, attr), f"Component {self.name!r}: {attr}", minimum=0)
        if not isinstance(self.kind, Kind):
            object.__setattr__(self, "kind", Kind(self.kind))

    def scaled(self, factor: float) -> Component:
        """The same component with RAM and VRAM multiplied by ``factor`` (counts unchanged)."""
        return replace(self, ram=int(round(self.ram * factor)), vram=int(round(self.vram * factor)))


@dataclass(frozen=True)
class Footprint:
    """The predicted peak of one trial: named components that add up.

    ``ram`` and ``vram`` are bytes, ``threads`` and ``processes`` counts; each is the sum over
    ``components``. Footprints compose with ``+`` (and ``sum()``).

    Examples:
        >>> fp = Footprint.of(ram="2GiB", threads=4, name="my formula")
        >>> (fp + Footprint.of(ram="512MiB")).ram
        2684354560
    """

    components: tuple[Component, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        for c in self.components:
            if not isinstance(c, Component):
                raise TypeError(f"Footprint components must be Component, but got {type(c).__name__}.")

    @classmethod
    def of(
        cls,
        *,
        ram: int | str = 0,
        vram: int | str = 0,
        threads: int = 0,
        processes: int = 0,
        name: str = "user formula",
        kind: Kind = Kind.USER,
    ) -> Footprint:
        """Wrap figures from the user's own formula; sizes may be human (``"1.5 GB"``)."""
        return cls(
            (
                Component(
                    name, Kind(kind), parse_bytes(ram, name="ram"), parse_bytes(vram, name="vram"), threads, processes
                ),
            )
        )

    @property
    def ram(self) -> int:
        return sum(c.ram for c in self.components)

    @property
    def vram(self) -> int:
        return sum(c.vram for c in self.components)

    @property
    def threads(self) -> int:
        return sum(c.threads for c in self.components)

    @property
    def processes(self) -> int:
        return sum(c.processes for c in self.components)

    def __add__(self, other: Footprint) -> Footprint:
        if isinstance(other, int) and other == 0:  # lets sum() start from 0
            return self
        if not isinstance(other, Footprint):
            return NotImplemented
        return Footprint(self.components + other.components)

    __radd__ = __add__

    def scaled(self, factor: float) -> Footprint:
        return Footprint(tuple(c.scaled(factor) for c in self.components))

    def by_kind(self) -> dict[Kind, Component]:
        """Components summed per kind, in the order kinds first appear."""
        out: dict[Kind, Component] = {}
        for c in self.components:
            prev = out.get(c.kind)
            out[c.kind] = (
                c
                if prev is None
                else Component(
                    c.kind.value,
                    c.kind,
                    prev.ram + c.ram,
                    prev.vram + c.vram,
                    prev.threads + c.threads,
                    prev.processes + c.processes,
                )
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bytes as ints); ``from_dict`` reads it back."""
        return {
            "ram": self.ram,
            "vram": self.vram,
            "threads": self.threads,
            "processes": self.processes,
            "components": [  # not dataclasses.asdict: it deep-copies each field (0.04 ms a trial's record)
                {
                    "name": c.name,
                    "kind": c.kind.value,
                    "ram": c.ram,
                    "vram": c.vram,
                    "threads": c.threads,
                    "processes": c.processes,
                    "note": c.note,
                }
                for c in self.components
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Footprint:
        return cls(tuple(Component(**{**c, "kind": Kind(c["kind"])}) for c in data["components"]))

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """The breakdown as text rows: (component, kind, ram, vram, threads, note), then a total row."""
        out = [
            (
                c.name,
                c.kind.value,
                format_bytes(c.ram) if c.ram else "-",
                format_bytes(c.vram) if c.vram else "-",
                str(c.threads) if c.threads else "-",
                c.note,
            )
            for c in self.components
        ]
        out.append(
            (
                "TOTAL",
                "",
                format_bytes(self.ram),
                format_bytes(self.vram),
                str(self.threads),
                f"{self.processes} extra process(es)" if self.processes else "",
            )
        )
        return out

    def table(self) -> str:
        """A plain-text breakdown table (the CLI may render it richer)."""
        header = ("component", "kind", "RAM", "VRAM", "threads", "note")
        rows = [header, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        lines = []
        for i, r in enumerate(rows):
            cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])] + [r[j].rjust(widths[j]) for j in (2, 3, 4)]
            lines.append("  ".join(cells + [r[5]]).rstrip())
            if i == 0 or i == len(rows) - 2:
                lines.append("-" * len(lines[0]))
        return "\n".join(lines)

    def __str__(self) -> str:
        return (
            f"Footprint(ram={format_bytes(self.ram)}, vram={format_bytes(self.vram)}, "
            f"threads={self.threads}, components={len(self.components)})"
        )


def total(parts: Iterable[Footprint]) -> Footprint:
    """Sum of footprints (``sum()`` works too)."""
    return sum(parts, Footprint())
