"""The order of admission on one host: a queue of tickets in the ledger's database, first come, first served
with conservative backfill, and the placement of a request on the room that is left.

Owns the tickets (taken, refreshed, withdrawn, dropped when their owner is gone or stopped trying), the room
the older tickets set aside, best-fit GPU placement and whether a request can ever fit; runs inside the
admission's transaction, after the host's lock, and knows nothing of entries' rows, reaping or retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import sqlalchemy as sa

from ..units import format_bytes
from ._capacity import HostCapacity, Request, Usage
from ._db import TICKETS_OF, Ticket, ticket_of, waiting_table
from ._owners import owner_alive

_logger = logging.getLogger("optuna_memprune.ledger")

#: A ticket whose owner has not tried for this long is dropped: a waiter that went away without withdrawing
#: (an exception caught above ``Ledger.admit``, a thread that stopped) blocks its host for at most this long.
#: Every try refreshes it: the runner's every 0.05-0.75 s (``runner/_reserve.py:next_try``), ``Ledger.admit``'s
#: every ``poll`` (0.2 s; its sleeps are cut to half of this), so 30 s is 40x the runner's longest gap and a
#: live waiter whose loop is slow for a while (a storage call retried, a loaded host) keeps its place.
TICKET_TTL_S = 30.0


def take_turn(
    conn: sa.Connection,
    host: str,
    capacity: HostCapacity,
    request: Request,
    used: Usage,
    owner: tuple[int, float],
    key: str,
    *,
    wait: bool,
) -> int | None | bool:
    """Where ``request`` of ``key`` goes now in its turn (see ``place``), False when it must wait.

    The caller's ticket (host, owner pid, key) is found, or, when the request does not fit, taken at the end of
    the queue (kept and refreshed on every try while ``wait``; removed when not). Admitted only if the request
    fits beside ``used`` after the room of every older live ticket is set aside first; then its ticket is deleted,
    the caller inserting the entry in the same transaction. Tickets of dead owners, or not seen for
    ``TICKET_TTL_S``, are deleted here first.
    """
    now = time.time()
    tickets = live_tickets(conn, host, now)
    pid, start = owner
    mine = next((t for t in tickets if t.owner_pid == pid and t.key == key), None)  # live: pid is the owner's
    older = tickets[: tickets.index(mine)] if mine is not None else tickets
    gpu = in_turn(capacity, request, used, older)
    if gpu is not False or not wait or misfit_of(capacity, request) or request == Request():
        if mine is not None:
            conn.execute(waiting_table.delete().where(waiting_table.c.id == mine.id))
        return gpu
    figures = dict(ram=request.ram, vram=request.vram, threads=request.threads, seen=now)
    if mine is not None:
        # A refused try writes only when it must: new figures, or a `seen` older than a quarter of the TTL. A
        # write per try made every refused try a commit (on SQLite an fsync), and 8 racing processes polling
        # every 3 ms took 100 s instead of 8 (tests/test_ledger.py::test_eight_racing_processes_...).
        same = (mine.ram, mine.vram, mine.threads) == (request.ram, request.vram, request.threads)
        if not same or mine.seen < now - TICKET_TTL_S / 4:
            conn.execute(waiting_table.update().where(waiting_table.c.id == mine.id).values(**figures))
    else:
        conn.execute(
            waiting_table.insert().values(host=host, owner_pid=pid, owner_start=start, key=key, created=now, **figures)
        )
    return False


def refused_unlocked(
    conn: sa.Connection,
    host: str,
    capacity: HostCapacity,
    request: Request,
    used: Usage,
    owner: tuple[int, float],
    key: str,
    owners_alive: bool,
) -> bool:
    """Whether a read without the host's lock shows that ``take_turn`` would refuse ``request`` and write
    nothing: no dead owner to reap (``owners_alive``), no ticket to drop, the caller's ticket there with the same
    figures and seen within a quarter of the TTL, and no room for it in its turn.

    Most tries of a waiter are such refusals. Read in a plain transaction (WAL: it waits for no writer), they
    leave the host's write lock to the admissions and releases that change something: 8 racing processes polling
    every 3 ms took 117 s on SQLite with every try under the lock, against 22 s on PostgreSQL. A refusal from a
    stale read is safe (it reserves nothing) and the next try reads again; a try that may be admitted, or must
    write, goes on under the lock and decides there.
    """
    now = time.time()
    tickets = [ticket_of(r) for r in conn.execute(TICKETS_OF, {"host": host})]
    if not owners_alive or any(gone(t, now) for t in tickets):
        return False
    pid = owner[0]
    mine = next((t for t in tickets if t.owner_pid == pid and t.key == key), None)
    if mine is None or mine.seen < now - TICKET_TTL_S / 4:
        return False
    if (mine.ram, mine.vram, mine.threads) != (request.ram, request.vram, request.threads):
        return False
    return in_turn(capacity, request, used, tickets[: tickets.index(mine)]) is False


def in_turn(capacity: HostCapacity, request: Request, used: Usage, older: Sequence[Ticket]) -> int | None | bool:
    """Where ``request`` goes beside ``used`` with the room of the ``older`` tickets set aside (see ``place``)."""
    gpu = place(capacity, request, used)
    if gpu is not False and older:
        gpu = place(capacity, request, set_aside(capacity, used, older), skip_unused=True)
    return gpu


def live_tickets(conn: sa.Connection, host: str, now: float) -> list[Ticket]:
    """The host's tickets oldest first, after deleting those whose owner is gone or not seen for the TTL."""
    tickets = [ticket_of(r) for r in conn.execute(TICKETS_OF, {"host": host})]
    dropped = [t for t in tickets if gone(t, now)]
    if dropped:
        conn.execute(waiting_table.delete().where(waiting_table.c.id.in_([t.id for t in dropped])))
        _logger.info(
            "Dropped %d tickets of waiters gone or silent for %.0f s on host %s: %s",
            len(dropped),
            TICKET_TTL_S,
            host,
            ", ".join(t.key for t in dropped),
        )
    return [t for t in tickets if t not in dropped]


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
