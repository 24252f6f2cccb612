"""A traced step as arrays, and what is read from it: the peak, its breakdown, the allocator timeline.

Owns ``Structure`` and ``Trace`` (plain data over the counter's records) and the numpy analysis of them;
knows nothing of torch modules, caches, calibration or footprints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dispatch import Category

__all__ = ["Structure", "Trace", "Peak", "analyse", "allocator_events", "positions"]

_N_CATS = len(Category)


@dataclass(frozen=True)
class Structure:
    """The shape of a trace, independent of the batch size: which storages, in which order, of what kind."""

    cats: np.ndarray  # per record: its Category
    rules: np.ndarray  # per record: kernel workspace rule (WORKSPACE_RULES) or -1 for a storage
    host: np.ndarray  # per record: on another device than the traced one (CPU scalars of a meta trace)
    owners: np.ndarray  # per record: index of the network a persistent storage belongs to, else -1
    n_nets: int
    events: np.ndarray  # r >= 0 alloc of record r, ~r free
    registered: int  # records 0..registered-1 existed before the step (weights, state, grads)
    prev_grad: tuple[tuple[int, int], ...]  # (param index, record) before the step
    new_grad: tuple[tuple[int, int], ...]  # (param index, record) after the step
    alloc_pos: np.ndarray  # per record: index of its alloc event
    free_pos: np.ndarray  # per record: index of its free event, len(events) if it outlives the step

    def same_as(self, other: Structure) -> bool:
        """Same storages in the same order (sizes aside): the condition for a linear fit over batch sizes."""
        return (
            self.registered == other.registered
            and self.n_nets == other.n_nets
            and self.prev_grad == other.prev_grad
            and self.new_grad == other.new_grad
            and all(
                np.array_equal(getattr(self, a), getattr(other, a))
                for a in ("cats", "rules", "host", "owners", "events")
            )
        )


@dataclass(frozen=True)
class Trace:
    """One traced step at one batch size: its structure and the bytes of every storage."""

    structure: Structure
    sizes: np.ndarray
    batch_size: int
    device: str

    @property
    def peak(self) -> int:
        """Peak of live tensor bytes during the step (all devices the trace saw); kernel workspaces excluded."""
        return analyse(self.structure, np.where(self.structure.rules >= 0, 0, self.sizes)).peak


@dataclass(frozen=True)
class Peak:
    """What ``analyse`` reads from a timeline; bytes, indexed by ``Category``."""

    peak: int
    at_peak: tuple[int, ...]  # live bytes per category at the peak
    final: tuple[tuple[int, ...], ...]  # per network, live bytes per category after the step (persistent)

    def persistent(self, cat: int) -> int:
        """Bytes of category ``cat`` alive after the step, over all networks."""
        return sum(f[cat] for f in self.final)


def positions(events: np.ndarray, n: int, *, alloc: bool) -> np.ndarray:
    """Event index of each record's allocation (or free; len(events) when never freed)."""
    pos = np.full(n, len(events), dtype=np.int64)
    idx = np.nonzero(events >= 0)[0] if alloc else np.nonzero(events < 0)[0]
    recs = events[idx] if alloc else ~events[idx]
    pos[recs] = idx
    return pos


def analyse(structure: Structure, sizes: np.ndarray, *, device_only: bool = False) -> Peak:
    """Peak of live bytes over the event timeline, the per-category split at the peak, and what persists.

    ``device_only`` leaves out the storages on the host (CPU scalars of a meta trace of a GPU step).
    """
    ev = structure.events
    if device_only:
        sizes = np.where(structure.host, 0, sizes)
    recs = np.where(ev >= 0, ev, ~ev)
    delta = np.where(ev >= 0, sizes[recs], -sizes[recs])
    totals = np.cumsum(delta)
    k = int(np.argmax(totals)) if len(totals) else 0
    peak = int(totals[k]) if len(totals) else 0
    live = (structure.alloc_pos <= k) & (structure.free_pos > k)
    at_peak = np.bincount(structure.cats[live], weights=sizes[live], minlength=_N_CATS)
    alive = structure.free_pos >= len(ev)
    owner = np.where(structure.owners >= 0, structure.owners, structure.n_nets)[alive]
    final = np.bincount(
        owner * _N_CATS + structure.cats[alive], weights=sizes[alive], minlength=(structure.n_nets + 1) * _N_CATS
    ).reshape(structure.n_nets + 1, _N_CATS)
    return Peak(peak, tuple(int(x) for x in at_peak), tuple(tuple(int(x) for x in row) for row in final))


def allocator_events(structure: Structure, sizes: np.ndarray, steps: int) -> list[tuple[int, int]]:
    """The step's timeline as ``(handle, nbytes)`` allocator events, the step repeated ``steps`` times.

    Persistent storages (the first ``registered`` events) are allocated once; each repetition frees the
    previous repetition's gradients where the trace freed the gradients that existed before it. Storages on
    the host (CPU scalars of a meta trace) are left out. ``nbytes`` is -1 for a free: the format of
    ``allocator.replay`` and ``heap.high_water``.
    """
    n = len(sizes)
    size_list = np.where(structure.host, 0, sizes).tolist()
    ev = structure.events.tolist()
    reg = structure.registered
    out = [(e, size_list[e]) for e in ev[:reg]]
    handle = list(range(n))
    # Registered records the step frees (the previous step's grads) -> the record replacing them.
    new_grad = dict(structure.new_grad)
    successor = [(prev, new_grad[i]) for i, prev in structure.prev_grad if i in new_grad]
    step_events = ev[reg:]
    append = out.append
    for step in range(steps):
        base = step * n
        for e in step_events:
            if e >= 0:
                h = base + e
                handle[e] = h
                append((h, size_list[e]))
            else:
                append((handle[~e], -1))
        for prev, new in successor:
            handle[prev] = handle[new]
    return out
