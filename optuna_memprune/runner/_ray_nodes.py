"""What a trial asks of a Ray cluster and whether the cluster can ever give it: the task's resources
(``memory``, ``num_cpus``, ``num_gpus``) from what the trial reserves (``_reserve.Reservations.figures``), the
alive nodes and their totals, the first misfit, and the memory of the cluster's GPUs (read once by NVML on
each GPU node).

Figures only, but for ``alive_nodes`` and ``gpu_memory``, which ask Ray; knows nothing of trials,
the study or the record.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

from ..units import format_bytes

_logger = logging.getLogger("optuna_memprune.guard")

#: Ray's fractional resources keep four decimal places (Ray's "Resources" docs: precision 0.0001).
GPU_STEP = 1e-4
#: How long the GPU probe (one small task per GPU node) may take: a fresh worker per node, started at once.
PROBE_S = 60.0


@dataclasses.dataclass(frozen=True)
class Ask:
    """The Ray resources of one trial's task: ``memory`` in bytes (0: none asked), CPUs and GPUs."""

    memory: int = 0
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def options(self) -> dict[str, Any]:
        """The task's ``.options(...)`` for these resources."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory:
            options["memory"] = self.memory
        return options

    def describe(self) -> str:
        return f"memory {format_bytes(self.memory)}, {_count(self.num_cpus, 'CPU')}, {_count(self.num_gpus, 'GPU')}"


@dataclasses.dataclass(frozen=True)
class Node:
    """One alive node of the cluster and its total resources (Ray's logical ones, not what is free now)."""

    node_id: str
    address: str
    memory: int
    cpus: float
    gpus: float

    def holds(self, ask: Ask) -> bool:
        """Whether the node could run the task once nothing else runs on it."""
        return ask.memory <= self.memory and ask.num_cpus <= self.cpus and ask.num_gpus <= self.gpus

    def describe(self) -> str:
        return f"memory {format_bytes(self.memory)}, {_count(self.cpus, 'CPU')}, {_count(self.gpus, 'GPU')}"


def nodes_of(info: list[dict[str, Any]]) -> list[Node]:
    """The alive nodes of ``ray.nodes()``'s answer, with their totals."""
    nodes = []
    for n in info:
        if not n.get("Alive", n.get("alive", False)):
            continue
        resources = n.get("Resources", {}) or {}
        nodes.append(
            Node(
                node_id=str(n.get("NodeID", "")),
                address=str(n.get("NodeManagerAddress", "")),
                memory=int(resources.get("memory", 0)),
                cpus=float(resources.get("CPU", 0)),
                gpus=float(resources.get("GPU", 0)),
            )
        )
    return nodes


def alive_nodes() -> list[Node]:
    """The cluster's alive nodes now."""
    import ray

    read: Callable[[], list[dict[str, Any]]] = ray.nodes  # untyped in Ray
    return nodes_of(read())


def ask_for(
    figures: dict[str, int], *, threads_budgeted: bool, unchecked: bool, nodes: list[Node], gpu_memory: int | None
) -> Ask:
    """The task's resources for a trial that reserves ``figures`` (bytes of RAM and VRAM, threads).

    - ``memory``: the RAM it reserves, as the local runner's ledger would.
    - ``num_cpus``: the threads it reserves where the guard's budget limits threads (``threads_budgeted``), at
      least 1; else 1, Ray's default for a task: a thread count is not a count of busy cores (an interpreter's
      idle threads, a BLAS pool), and without a thread budget the local runner's host has no thread limit.
    - ``num_gpus``: its VRAM as a fraction of a GPU's memory (``gpu_memory``, the cluster's smallest GPU),
      rounded up to Ray's precision; a whole GPU where that memory is unknown; 0 without VRAM, or on a
      cluster without GPUs (the trial runs on CPUs, as on a host without GPUs).

    A trial ``unchecked`` at launch reserves its budget, at most what the largest node has: it runs alone
    there, as the local runner caps it at the host's capacity.
    """
    memory = figures["ram"]
    cpus = float(max(1, figures["threads"])) if threads_budgeted else 1.0
    vram = figures["vram"] if any(n.gpus for n in nodes) else 0
    if unchecked and nodes:
        memory = min(memory, max(n.memory for n in nodes))
        cpus = min(cpus, max(1.0, max(n.cpus for n in nodes)))
        vram = min(vram, gpu_memory) if gpu_memory else vram
    gpus = 0.0
    if vram > 0:
        gpus = 1.0 if not gpu_memory else round(math.ceil(vram / gpu_memory / GPU_STEP) * GPU_STEP, 4)
    return Ask(memory=memory, num_cpus=cpus, num_gpus=gpus)


def misfit(ask: Ask, nodes: list[Node], gpu_memory: int | None) -> str:
    """Why no alive node can ever run the task (its ask is more than any node has in all), ``""`` where one
    can. A trial's VRAM is on one GPU: more than one GPU's memory never fits."""
    if ask.num_gpus > 1.0:
        return (
            f"it asks {ask.describe()}: its VRAM is more than a GPU of the Ray cluster holds "
            f"({format_bytes(gpu_memory or 0)}, the smallest)"
        )
    if any(n.holds(ask) for n in nodes):
        return ""
    offers = sorted({n.describe() for n in nodes})
    listed = "; ".join(offers[:4]) + (f"; and {len(offers) - 4} more" if len(offers) > 4 else "")
    return f"it asks {ask.describe()}, more than any alive node of the Ray cluster has in all ({listed or 'none'})"


def gpu_memory(nodes: list[Node]) -> int | None:
    """The memory of the cluster's smallest GPU, read by NVML in a small task on each node with GPUs (no GPU
    taken); None without GPUs, or where no node could read it (then a trial with VRAM asks a whole GPU)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ._ray_task import gpu_totals

    gpu_nodes = [n for n in nodes if n.gpus > 0]
    if not gpu_nodes:
        return None
    probe = ray.remote(num_cpus=0, max_retries=0)(gpu_totals)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote()
        for n in gpu_nodes
    ]
    totals: list[int] = []
    try:
        for found in ray.get(refs, timeout=PROBE_S):
            totals += [t for t in found if t > 0]
    except Exception as exc:  # noqa: BLE001 - no NVML there, a node gone: whole GPUs instead
        _logger.warning("Reading the Ray cluster's GPU memory failed (%s): a trial with VRAM asks a whole GPU.", exc)
        return None
    if not totals:
        _logger.warning("NVML read no GPU memory on the Ray cluster's GPU nodes: a trial with VRAM asks a whole GPU.")
        return None
    return min(totals)


def _count(n: float, what: str) -> str:
    shown = f"{n:g}"
    return f"{shown} {what}" + ("" if shown == "1" else "s")
