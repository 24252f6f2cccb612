"""One try of the ledger as a read and a commit: a host's state read in one statement, and what a try decided
on it committed only if the host's version is still the one read.

Owns ``State`` (a host's version, entries and tickets in one snapshot), ``Plan`` (what a try writes) and
``commit``: on PostgreSQL one statement without a transaction (a round trip; the host's row is locked only
while the statement runs, never while a client decides), elsewhere the statements inside the caller's
transaction. Knows nothing of capacities, turns or liveness (``_queue.decide`` makes the plan).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields, replace

import sqlalchemy as sa

from ._capacity import HostCapacity, Request
from ._db import STATE_OF, Entry, LedgerError, Ticket, entries_table, hosts_table, reaped_table, waiting_table

#: The version check and bump every commit starts with (elsewhere than PostgreSQL).
_BUMP = (
    hosts_table.update()
    .where(hosts_table.c.host == sa.bindparam("h"), hosts_table.c.version == sa.bindparam("v"))
    .values(version=hosts_table.c.version + 1)
)
_ENTRY_COLUMNS = "host, owner_pid, owner_start, key, ram, vram, gpu, threads, created"
# PostgreSQL: every write of the plan as a data-modifying CTE gated on the version bump, in one statement
# (atomic without a transaction). The bump's UPDATE locks the host's row and, having waited for another
# commit, checks the version on the row that commit left: a plan decided on an older read writes nothing.
# Each parameter is cast: one that is NULL where a part writes nothing still has its column's type.
_PG_COMMIT = f"""
WITH bump AS (
    UPDATE {hosts_table.name} SET version = version + 1
    WHERE host = %(host)s AND version = %(version)s::bigint RETURNING version
), gone AS (
    DELETE FROM {entries_table.name}
    WHERE id = ANY(%(reap)s::bigint[]) AND host = %(host)s AND EXISTS (SELECT FROM bump)
    RETURNING id, {_ENTRY_COLUMNS}
), kept AS (
    INSERT INTO {reaped_table.name} (entry_id, {_ENTRY_COLUMNS}, reaped, reaped_by)
    SELECT id, {_ENTRY_COLUMNS}, %(now)s::double precision, %(pid)s::integer FROM gone
), dropped AS (
    DELETE FROM {waiting_table.name}
    WHERE id = ANY(%(drop)s::bigint[]) AND host = %(host)s AND EXISTS (SELECT FROM bump)
), queued AS (
    INSERT INTO {waiting_table.name} (host, owner_pid, owner_start, key, ram, vram, threads, created, seen)
    SELECT %(host)s, %(t_pid)s::integer, %(t_start)s::double precision, %(t_key)s::text, %(t_ram)s::bigint,
        %(t_vram)s::bigint, %(t_threads)s::integer, %(now)s::double precision, %(now)s::double precision
    FROM bump WHERE %(t_new)s::boolean
), refreshed AS (
    UPDATE {waiting_table.name}
    SET ram = %(t_ram)s::bigint, vram = %(t_vram)s::bigint, threads = %(t_threads)s::integer,
        seen = %(now)s::double precision
    WHERE id = %(t_id)s::bigint AND EXISTS (SELECT FROM bump)
), admitted AS (
    INSERT INTO {entries_table.name} ({_ENTRY_COLUMNS})
    SELECT %(host)s, %(e_pid)s::integer, %(e_start)s::double precision, %(e_key)s::text, %(e_ram)s::bigint,
        %(e_vram)s::bigint, %(e_gpu)s::integer, %(e_threads)s::integer, %(e_created)s::double precision
    FROM bump WHERE %(e_new)s::boolean RETURNING id
)
SELECT (SELECT version FROM bump), (SELECT id FROM admitted), (SELECT array_agg(id) FROM gone)
"""


# PostgreSQL: a waiter's try in one statement. It reads the host as ``STATE_OF`` does and, in the same snapshot,
# admits the request if it fits beside every entry and every older ticket (dead owners and silent waiters
# counted: a conservative part of what ``_queue.decide`` admits; no GPU memory asked), else takes its ticket;
# both bump the version, checked as in ``_PG_COMMIT``, except the admission of a request of nothing (it moves
# no sum, so it takes no lock). A ticket already there is refreshed when stale (no bump: its place and figures
# stay). ``_queue.decide`` then runs on the read, these writes applied, for what only it
# does (reaping, dropping gone tickets, a fit that needs them): a try is then one round trip, not two.
_PG_FAST_TRY = f"""
WITH cur AS (
    SELECT version FROM {hosts_table.name} WHERE host = %(host)s
), mine AS (
    SELECT id FROM {waiting_table.name}
    WHERE host = %(host)s AND owner_pid = %(pid)s::integer AND key = %(key)s::text
        AND seen >= %(expired)s::double precision
    ORDER BY id LIMIT 1
), used AS (
    SELECT coalesce(sum(ram), 0) AS ram, coalesce(sum(threads), 0) AS threads
    FROM {entries_table.name} WHERE host = %(host)s
), older AS (
    SELECT coalesce(sum(ram), 0) AS ram, coalesce(sum(threads), 0) AS threads FROM {waiting_table.name}
    WHERE host = %(host)s AND id < coalesce((SELECT id FROM mine), 9223372036854775807)
), fits AS (
    SELECT (%(cap_ram)s::bigint IS NULL OR (used.ram + %(ram)s::bigint <= %(cap_ram)s::bigint
            AND (%(ram)s::bigint = 0 OR used.ram + older.ram + %(ram)s::bigint <= %(cap_ram)s::bigint)))
        AND (%(cap_threads)s::bigint IS NULL OR (used.threads + %(threads)s::bigint <= %(cap_threads)s::bigint
            AND (%(threads)s::bigint = 0
                OR used.threads + older.threads + %(threads)s::bigint <= %(cap_threads)s::bigint)))
        AND NOT EXISTS (
            SELECT FROM {entries_table.name}
            WHERE host = %(host)s AND owner_pid = %(pid)s::integer AND key = %(key)s::text
        ) AS ok
    FROM used, older
), bump AS (
    UPDATE {hosts_table.name} SET version = version + 1
    WHERE host = %(host)s AND version = (SELECT version FROM cur) AND %(sized)s::boolean
        AND ((SELECT ok FROM fits) OR NOT EXISTS (SELECT FROM mine))
    RETURNING version, (SELECT ok FROM fits) AS admit
), admitted AS (
    INSERT INTO {entries_table.name} ({_ENTRY_COLUMNS})
    SELECT %(host)s, %(pid)s::integer, %(start)s::double precision, %(key)s::text, %(ram)s::bigint, 0, NULL,
        %(threads)s::integer, %(now)s::double precision
    WHERE (SELECT ok FROM fits) AND (NOT %(sized)s::boolean OR EXISTS (SELECT FROM bump WHERE admit))
    RETURNING id
), done AS (
    DELETE FROM {waiting_table.name} WHERE id = (SELECT id FROM mine) AND EXISTS (SELECT FROM admitted)
), queued AS (
    INSERT INTO {waiting_table.name} (host, owner_pid, owner_start, key, ram, vram, threads, created, seen)
    SELECT %(host)s, %(pid)s::integer, %(start)s::double precision, %(key)s::text, %(ram)s::bigint, 0,
        %(threads)s::integer, %(now)s::double precision, %(now)s::double precision
    FROM bump WHERE NOT admit RETURNING id
), refreshed AS (
    UPDATE {waiting_table.name} SET seen = %(now)s::double precision
    WHERE id = (SELECT id FROM mine) AND NOT (SELECT ok FROM fits) AND ram = %(ram)s::bigint AND vram = 0
        AND threads = %(threads)s::integer AND seen < %(stale)s::double precision
    RETURNING id
)
SELECT (SELECT version FROM cur), (SELECT version FROM bump), (SELECT id FROM admitted),
    (SELECT id FROM queued), (SELECT id FROM refreshed),
    CASE WHEN NOT EXISTS (SELECT FROM admitted) THEN (
        SELECT json_agg(json_build_array(id, owner_pid, owner_start, key, ram, vram, gpu, threads, created)
        ORDER BY id) FROM {entries_table.name} WHERE host = %(host)s) END,
    CASE WHEN NOT EXISTS (SELECT FROM admitted) THEN (
        SELECT json_agg(json_build_array(id, owner_pid, owner_start, key, ram, vram, threads, created, seen)
        ORDER BY id) FROM {waiting_table.name} WHERE host = %(host)s) END
"""


@dataclass(frozen=True)
class State:
    """A host's version, entries and tickets (each oldest first), read in one snapshot."""

    host: str
    version: int
    entries: list[Entry]
    tickets: list[Ticket]


@dataclass(frozen=True)
class Plan:
    """What one try writes, all or nothing: the entries of dead owners to move to the reaped table, the tickets
    of gone waiters to delete, the caller's ticket to delete (``done``, its id) or to write (``ticket``: id 0,
    taken at the end of the queue; else its figures and ``seen`` refreshed) and its new entry (id 0, the
    database's given on commit)."""

    version: int
    reap: tuple[Entry, ...] = ()
    drop: tuple[Ticket, ...] = ()
    done: int | None = None
    ticket: Ticket | None = None
    entry: Entry | None = None

    def writes(self) -> bool:
        return bool(self.reap or self.drop or self.done or self.ticket or self.entry)

    def dropped(self) -> list[int]:
        """The ids of the tickets it deletes."""
        return [t.id for t in self.drop] + ([] if self.done is None else [self.done])


@dataclass(frozen=True)
class Committed:
    """A plan written: its entry's id (None without one) and the ids of the entries it reaped (those another
    process removed since the read are not among them)."""

    entry_id: int | None
    reaped: frozenset[int] = field(default_factory=frozenset)


def read_state(conn: sa.Connection, host: str) -> State:
    version, entries, tickets = 0, [], []
    for r in conn.execute(STATE_OF, {"host": host}).all():
        if r.kind == "v":
            version = r.id
        elif r.kind == "e":
            entries.append(
                Entry(r.id, host, r.owner_pid, r.owner_start, r.key, r.ram, r.vram, r.gpu, r.threads, r.created)
            )
        else:
            tickets.append(
                Ticket(r.id, host, r.owner_pid, r.owner_start, r.key, r.ram, r.vram, r.threads, r.created, r.seen)
            )
    return State(host, version, entries, tickets)


def commit(conn: sa.Connection, host: str, plan: Plan) -> Committed | None:
    """Write ``plan`` if the host's version is still ``plan.version`` (and bump it); None, writing nothing, when
    another commit moved it since the read."""
    if conn.dialect.name == "postgresql":
        return _commit_one_statement(conn, host, plan)
    if conn.execute(_BUMP, {"h": host, "v": plan.version}).rowcount != 1:
        return None
    reaped: frozenset[int] = frozenset()
    if plan.reap:  # only those still there: a release since the read is no death
        ids = [e.id for e in plan.reap]
        there = {r.id for r in conn.execute(sa.select(entries_table.c.id).where(entries_table.c.id.in_(ids)))}
        reaped = frozenset(there)
        if there:
            conn.execute(entries_table.delete().where(entries_table.c.id.in_(there)))
            now, pid = time.time(), os.getpid()
            rows = [dict(_values(e), entry_id=e.id, reaped=now, reaped_by=pid) for e in plan.reap if e.id in there]
            conn.execute(reaped_table.insert(), rows)
    if plan.dropped():
        conn.execute(waiting_table.delete().where(waiting_table.c.id.in_(plan.dropped())))
    if plan.ticket is not None:
        t = plan.ticket
        figures = dict(ram=t.ram, vram=t.vram, threads=t.threads, seen=t.seen)
        if t.id:
            conn.execute(waiting_table.update().where(waiting_table.c.id == t.id).values(**figures))
        else:
            values = dict(host=host, owner_pid=t.owner_pid, owner_start=t.owner_start, key=t.key, created=t.created)
            conn.execute(waiting_table.insert().values(**values, **figures))
    entry_id = None
    if plan.entry is not None:
        inserted = conn.execute(entries_table.insert(), _values(plan.entry)).inserted_primary_key
        if inserted is None:  # SQLAlchemy gives the key of the row a single-row INSERT added; never None here
            raise LedgerError("the ledger database gave no id for the entry it inserted")
        entry_id = inserted[0]
    return Committed(entry_id, reaped)


def fast_try(
    conn: sa.Connection, *, host: str, capacity: HostCapacity, request: Request, owner: tuple[int, float], key: str,
    ttl: float,
) -> tuple[State, Entry | None, bool]:  # fmt: skip
    """One waiter's try on PostgreSQL in one statement (``_PG_FAST_TRY``) for a request of no GPU memory: the
    host as read, with what the statement wrote applied (its ticket taken or refreshed, the version it bumped),
    the entry it admitted (None when not), and whether it wrote anything. A ticket is refreshed after a quarter
    of ``ttl``; one not seen for ``ttl`` is no longer the caller's place (``_queue.gone``). A request of nothing
    takes no ticket (``_queue.decide``)."""
    now, (pid, start), ram, threads = time.time(), owner, request.ram, request.threads
    params = dict(
        host=host, pid=pid, start=start, key=key, ram=ram, threads=threads, cap_ram=capacity.ram,
        cap_threads=capacity.threads, now=now, stale=now - ttl / 4, expired=now - ttl, sized=bool(ram or threads),
    )  # fmt: skip
    version, bumped, admitted, queued, refreshed, entries, tickets = conn.exec_driver_sql(_PG_FAST_TRY, params).one()
    state = State(
        host,
        version if bumped is None else bumped,
        [Entry(r[0], host, *r[1:]) for r in entries or ()],
        [Ticket(r[0], host, *r[1:]) for r in tickets or ()],
    )
    if admitted is not None:
        return state, Entry(admitted, host, pid, start, key, ram, 0, None, threads, now), True
    if queued is not None:
        state.tickets.append(Ticket(queued, host, pid, start, key, ram, 0, threads, now, now))
    if refreshed is not None:
        state.tickets[:] = [replace(t, seen=now) if t.id == refreshed else t for t in state.tickets]
    return state, None, bumped is not None or refreshed is not None


def _commit_one_statement(conn: sa.Connection, host: str, plan: Plan) -> Committed | None:
    t, e = plan.ticket, plan.entry
    params = {
        "host": host,
        "version": plan.version,
        "reap": [x.id for x in plan.reap],
        "drop": plan.dropped(),
        "now": time.time(),
        "pid": os.getpid(),
        "t_new": t is not None and not t.id,
        "t_id": t.id if t is not None and t.id else None,
        "t_pid": None if t is None else t.owner_pid,
        "t_start": None if t is None else t.owner_start,
        "t_key": None if t is None else t.key,
        "t_ram": None if t is None else t.ram,
        "t_vram": None if t is None else t.vram,
        "t_threads": None if t is None else t.threads,
        "e_new": e is not None,
        **{f"e_{k}": None if e is None else getattr(e, k) for k in ("ram", "vram", "gpu", "threads", "created")},
        "e_pid": None if e is None else e.owner_pid,
        "e_start": None if e is None else e.owner_start,
        "e_key": None if e is None else e.key,
    }
    version, entry_id, reaped = conn.exec_driver_sql(_PG_COMMIT, params).one()
    if version is None:
        return None
    return Committed(entry_id, frozenset(reaped or ()))


def _values(entry: Entry) -> dict[str, object]:
    """An entry's columns, its id left to the database."""
    return {f.name: getattr(entry, f.name) for f in fields(Entry) if f.name != "id"}
