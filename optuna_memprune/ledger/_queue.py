"""The order of admission on one host: a queue of tickets in the ledger's database, first come, first served
with conservative backfill, the placement of a request on the room that is left, and what one try writes.

Owns the tickets (taken, refreshed, withdrawn, dropped when their owner is gone or stopped trying), the room
the older tickets set aside, best-fit GPU placement, whether a request can ever fit, and ``decide``: a try's
plan from one read of its host (``_commit.py`` writes it); knows nothing of SQL beyond withdrawing a ticket.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import sqlalchemy as sa

from ..units import format_bytes
from ._capacity import HostCapacity, Request, Usage
from ._commit import Plan, State
from ._db import Entry, Ticket, waiting_table
from ._owners import owner_alive

#: A ticket whose owner has not tried for this long is dropped: a waiter that went away without withdrawing
#: (an exception caught above ``Ledger.admit``, a thread that stopped) blocks its host for at most this long.
#: Every try refreshes it: the runner's every 0.05-0.75 s (``runner/_reserve.py:next_try``), ``Ledger.admit``'s
#: every ``poll`` (0.2 s; its sleeps are cut to half of this), so 30 s is 40x the runner's longest gap and a
#: live waiter whose loop is slow for a while (a storage call retried, a loaded host) keeps its place.
TICKET_TTL_S = 30.0


def decide(
    state: State,
    capacity: HostCapacity,
    request: Request | None,
    owner: tuple[int, float],
    key: str,
    *,
    wait: bool,
    found: bool = False,
) -> tuple[Plan, Entry | None]:
    """What one try of ``request`` for ``key`` writes, decided on one read of its host: the plan, and the entry
    it admits (id 0 until committed) or None when it must wait.

    Entries of dead owners are reaped, and tickets whose owner is gone or silent for ``TICKET_TTL_S`` dropped.
    The caller's ticket (owner pid and key) is found, or, when the request does not fit, taken at the end of
    the queue (kept while ``wait``; removed when not). Admitted only if the request fits beside the live
    entries after the room of every older live ticket is set aside first; then its ticket is deleted. A refused
    try writes its ticket only when it must: new figures, or a ``seen`` older than a quarter of the TTL (a write
    per try made every refused try a commit, on SQLite an fsync: 8 racing processes polling every 3 ms took
    100 s instead of 8, tests/test_ledger.py::test_eight_racing_processes_...). So most tries of a waiter write
    nothing and take no lock. ``request`` None: only reaping and dropping. ``found``: an earlier attempt of
    this try may have committed (its answer lost); an entry of the caller's owner and key is that one.
    """
    now = time.time()
    dead = tuple(e for e in state.entries if not owner_alive(e.owner_pid, e.owner_start))
    live = [e for e in state.entries if e not in dead]
    dropped = [t for t in state.tickets if gone(t, now)]
    tickets = [t for t in state.tickets if t not in dropped]
    plan = Plan(state.version, reap=dead, drop=tuple(dropped))
    pid, start = owner
    if found:
        mine_entry = next((e for e in live if (e.owner_pid, e.owner_start, e.key) == (pid, start, key)), None)
        if mine_entry is not None:
            return Plan(state.version), mine_entry  # nothing to write: it is there
    if request is None:
        return plan, None
    mine = next((t for t in tickets if t.owner_pid == pid and t.key == key), None)  # live: pid is the owner's
    older = tickets[: tickets.index(mine)] if mine is not None else tickets
    gpu = in_turn(capacity, request, Usage.of(live, capacity), older)
    if gpu is not False or not wait or misfit_of(capacity, request) or request == Request():
        plan = replace(plan, done=None if mine is None else mine.id)
        if gpu is False:
            return plan, None
        entry = Entry(0, state.host, pid, start, key, request.ram, request.vram, gpu, request.threads, now)
        return replace(plan, entry=entry), entry
    ram, vram, threads = request.ram, request.vram, request.threads
    if mine is None:
        ticket: Ticket | None = Ticket(0, state.host, pid, start, key, ram, vram, threads, created=now, seen=now)
    elif (mine.ram, mine.vram, mine.threads) != (ram, vram, threads):
        ticket = replace(mine, ram=ram, vram=vram, threads=threads, seen=now)
    else:
        ticket = replace(mine, seen=now) if mine.seen < now - TICKET_TTL_S / 4 else None
    return replace(plan, ticket=ticket), None


def in_turn(capacity: HostCapacity, request: Request, used: Usage, older: Sequence[Ticket]) -> int | None | bool:
    """Where ``request`` goes beside ``used`` with the room of the ``older`` tickets set aside (see ``place``)."""
    gpu = place(capacity, request, used)
    if gpu is not False and older:
        gpu = place(capacity, request, set_aside(capacity, used, older), skip_unused=True)
    return gpu


def gone(ticket: Ticket, now: float) -> bool:
    """Whether ``ticket``'s owner is gone or has not tried for ``TICKET_TTL_S``."""
    return ticket.seen < now - TICKET_TTL_S or not owner_alive(ticket.owner_pid, ticket.owner_start)


def withdraw(conn: sa.Connection, host: str, owner_pid: int, key: str) -> bool:
    """Delete the ticket of ``(owner_pid, key)``; False when there was none."""
    c = waiting_table.c
    return (
        conn.execute(waiting_table.delete().where(c.host == host, c.owner_pid == owner_pid, c.key == key)).rowcount > 0
    )


def set_aside(capacity: HostCapacity, used: Usage, older: Sequence[Ticket]) -> Usage:
    """``used`` plus the room of the ``older`` tickets, in order: RAM and threads summed, VRAM placed best fit.

    A ticket that fits no GPU now is set aside on the one nearest to fitting (the most free memory among those
    large enough), which it overcommits: nothing later goes there until that GPU has room for it. A ticket that
    can never fit this capacity sets nothing aside (processes may give one host different capacities).
    """
    ram, threads, vram = used.ram, used.threads, list(used.vram)
    for t in older:
        asked = Request(ram=t.ram, vram=t.vram, threads=t.threads)
        if misfit_of(capacity, asked):
            continue
        ram, threads = ram + t.ram, threads + t.threads
        if t.vram:
            gpu = best_fit(capacity.gpus, vram, t.vram)
            if gpu is None:  # the GPU nearest to fitting: the most free memory, lowest index on ties
                sizes = enumerate(zip(capacity.gpus, vram, strict=False))
                gpu = min((u - total, i) for i, (total, u) in sizes if total >= t.vram)[1]
            vram[gpu] += t.vram
    return Usage(ram=ram, threads=threads, vram=tuple(vram))


def place(capacity: HostCapacity, request: Request, used: Usage, *, skip_unused: bool = False) -> int | None | bool:
    """The GPU index for ``request`` beside ``used``, None when it needs no GPU, False when it does not fit.

    ``skip_unused``: a resource the request does not ask for (0) is not checked, so a CPU-only request is not
    held back by the room set aside for GPU waiters.
    """
    if capacity.ram is not None and (request.ram or not skip_unused) and used.ram + request.ram > capacity.ram:
        return False
    threads = capacity.threads
    if threads is not None and (request.threads or not skip_unused) and used.threads + request.threads > threads:
        return False
    if request.vram == 0:
        return None
    gpu = best_fit(capacity.gpus, used.vram, request.vram)
    return False if gpu is None else gpu


def best_fit(gpus: Sequence[int], used: Sequence[int], vram: int) -> int | None:
    """The GPU with the least free memory that still fits ``vram`` (lowest index on ties), None if none does."""
    free = [(total - u, i) for i, (total, u) in enumerate(zip(gpus, used, strict=False)) if total - u >= vram]
    return min(free)[1] if free else None


def misfit_of(capacity: HostCapacity, request: Request) -> str:
    """Why ``request`` can never fit ``capacity``, even with no other entry (``""`` when it can)."""
    cap = capacity
    if cap.ram is not None and request.ram > cap.ram:
        return f"ram {format_bytes(request.ram)} > capacity {format_bytes(cap.ram)}"
    if cap.threads is not None and request.threads > cap.threads:
        return f"threads {request.threads} > capacity {cap.threads}"
    if request.vram > 0 and not cap.gpus:
        return f"vram {format_bytes(request.vram)} asked, but the host has no GPU"
    if request.vram > 0 and request.vram > max(cap.gpus):
        return f"vram {format_bytes(request.vram)} > the largest GPU's capacity {format_bytes(max(cap.gpus))}"
    return ""
