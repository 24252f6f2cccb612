"""What a host offers its trials and what one trial asks of it: budgets, capacities, requests, usage sums.

Owns the figures and their checks (RAM, GPU memory per NVML index, threads); knows nothing of the ledger's
database, its transactions or process liveness.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psutil

from .. import cgroups
from ..units import check_int, check_number, format_bytes, parse_bytes


@dataclass(frozen=True)
class HostCapacity:
    """What the running trials of one host may reserve in all: bytes and counts, ``None`` = unlimited.

    ``gpus[i]`` is the memory of GPU index ``i`` (NVML's index; see ``Ledger`` on CUDA's order).
    ``source`` says where an ``"auto"`` RAM figure came from (``available_ram``); ``""`` when given.
    """

    ram: int | None
    gpus: tuple[int, ...] = ()
    threads: int | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.ram is not None:
            check_int(self.ram, "HostCapacity.ram", minimum=0)
        object.__setattr__(
            self, "gpus", tuple(check_int(g, f"HostCapacity.gpus[{i}]", minimum=0) for i, g in enumerate(self.gpus))
        )
        check_int(self.threads, "HostCapacity.threads", minimum=1, optional=True)


@dataclass(frozen=True)
class HostBudget:
    """The host's resources for parallel trials, as a user gives them; ``resolve`` makes them concrete.

    Args:
        ram: Host RAM for trials: bytes, a size such as ``"48GiB"``, ``"auto"`` (default: what
            ``available_ram`` says when resolved: psutil's available memory, or the room left under
            this process's cgroup limit where that is less) or ``None`` (unlimited).
        gpus: Memory per GPU index: a sequence of sizes (``["8GiB", "16GiB"]``), ``"auto"`` (default: NVML's
            totals; no GPUs where NVML is missing) or ``None``/``[]`` (no GPUs).
        headroom: Fraction of every RAM and GPU figure kept free, in [0, 1). Default 0.1.
        threads: Total threads of the running trials, or ``None`` (default: unlimited).

    Notes:
        - ``"auto"`` RAM is *available* memory at the moment of ``resolve`` (psutil's ``available``,
          not ``free``: page cache counts as usable). Resolve before the trials start: memory the trials
          already hold is not available, so resolving later counts it twice.
        - A container's, a Slurm job's or a systemd slice's memory limit is a cgroup limit that psutil does
          not see: where the tightest limit of this process's cgroup ancestry is below physical memory,
          ``"auto"`` is at most that limit less the group's usage, and ``HostCapacity.source`` says so.

    Examples:
        >>> HostBudget(ram="10GiB", gpus=["8GiB"], headroom=0.5).resolve().gpus
        (4294967296,)
    """

    ram: int | str | None = "auto"
    gpus: Sequence[int | str] | str | None = "auto"
    headroom: float = 0.1
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.ram is not None and self.ram != "auto":
            object.__setattr__(self, "ram", parse_bytes(self.ram, name="HostBudget.ram"))
        gpus = self.gpus
        if gpus is None:
            gpus = ()
        elif isinstance(gpus, str):
            if gpus != "auto":
                raise ValueError(
                    "HostBudget.gpus must be 'auto', None or a sequence of sizes, one per GPU index "
                    f"(e.g. ['16GiB']), but got {gpus!r}."
                )
        elif isinstance(gpus, Sequence):
            gpus = tuple(parse_bytes(g, name=f"HostBudget.gpus[{i}]") for i, g in enumerate(gpus))
        else:
            raise ValueError(
                f"HostBudget.gpus must be 'auto', None or a sequence of sizes, one per GPU index, but got {gpus!r}."
            )
        object.__setattr__(self, "gpus", gpus)
        check_number(
            self.headroom, "HostBudget.headroom", minimum=0, maximum=1, open_max=True, expected="a fraction in [0, 1)"
        )
        check_int(self.threads, "HostBudget.threads", minimum=1, optional=True)

    def resolve(self) -> HostCapacity:
        """Return the concrete capacity: each RAM and GPU figure x (1 - headroom); ``"auto"`` read now."""
        keep = 1.0 - self.headroom
        # ``__post_init__`` left each figure "auto" (the one str it keeps) or bytes; parse_bytes keeps bytes as
        # they are, for the type of a figure declared as given
        ram: int | None
        if isinstance(self.ram, str):
            ram, source = available_ram()
        else:
            ram, source = self.ram, ""
        if isinstance(self.gpus, str):
            gpus = _nvml_totals()
        else:
            gpus = tuple(parse_bytes(g, name=f"HostBudget.gpus[{i}]") for i, g in enumerate(self.gpus or ()))
        return HostCapacity(
            ram=None if ram is None else int(ram * keep),
            gpus=tuple(int(g * keep) for g in gpus),
            threads=self.threads,
            source=source,
        )


def available_ram() -> tuple[int, str]:
    """The RAM this process may still take now, and where the figure came from: psutil's ``available``
    (``"available memory"``), or the room under this process's tightest cgroup limit (its limit less its
    usage) where that limit is below physical memory and the room is less."""
    vm = psutil.virtual_memory()
    limit = cgroups.host_limit()
    if limit is None or limit.limit >= vm.total or vm.available <= limit.limit - limit.usage:
        return vm.available, f"available memory {format_bytes(vm.available)}"
    room = max(0, limit.limit - limit.usage)
    return room, f"{limit.source} less usage {format_bytes(limit.usage)}"


def physical_ram() -> tuple[int, str]:
    """This machine's RAM as this process can ever use it: physical memory, or its tightest cgroup limit
    where lower; and which of the two (``"physical memory"``, ``HostLimit.source``)."""
    total = psutil.virtual_memory().total
    limit = cgroups.host_limit()
    if limit is None or limit.limit >= total:
        return total, "physical memory"
    return limit.limit, limit.source


def _nvml_totals() -> tuple[int, ...]:
    """Total memory of every GPU NVML sees, by index; () without NVML. A device NVML cannot read counts 0."""
    from ..monitor import gpu_reader  # pynvml is imported on first use

    reader = gpu_reader()
    if reader is None:
        return ()
    try:
        totals = {index: total for index, total, _ in reader.devices()}
        return tuple(totals.get(i, 0) for i in range(reader.count))
    finally:
        reader.close()


@dataclass(frozen=True)
class Request:
    """What one trial asks the host for: bytes of RAM, bytes of memory on one GPU, threads.

    The caller has already multiplied its prediction by the learned margin. ``vram > 0`` asks for a GPU.
    """

    ram: int = 0
    vram: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        for name in ("ram", "vram", "threads"):
            check_int(getattr(self, name), f"Request.{name}", minimum=0)


class Usage(NamedTuple):
    """The sum of a host's reservations: bytes of RAM, threads, bytes per GPU index."""

    ram: int
    threads: int
    vram: tuple[int, ...]

    @classmethod
    def of(cls, entries: Iterable[Any], capacity: HostCapacity) -> Usage:
        """The sums of reservations (each with ``ram``, ``threads``, ``gpu`` and ``vram``), ``vram`` per GPU of
        ``capacity``: an entry placed by a ledger that saw more GPUs is not counted there."""
        entries, vram = list(entries), [0] * len(capacity.gpus)
        for e in entries:
            if e.gpu is not None and 0 <= e.gpu < len(vram):
                vram[e.gpu] += e.vram
        return cls(ram=sum(e.ram for e in entries), threads=sum(e.threads for e in entries), vram=tuple(vram))


def describe(x: Request | Usage | HostCapacity) -> str:
    """``ram=..., threads=..., vram=...`` in human sizes; a capacity whose RAM was read as ``"auto"`` says
    where from (available memory, or a cgroup's limit less its usage)."""
    vram = x.gpus if isinstance(x, HostCapacity) else x.vram
    parts = [
        f"ram={'unlimited' if x.ram is None else format_bytes(x.ram)}",
        f"threads={'unlimited' if x.threads is None else x.threads}",
    ]
    if isinstance(vram, tuple):
        parts.append("vram=[" + ", ".join(format_bytes(v) for v in vram) + "]")
    else:
        parts.append(f"vram={format_bytes(vram)}")
    source = getattr(x, "source", "")
    return ", ".join(parts) + (f" (ram from {source})" if source else "")
