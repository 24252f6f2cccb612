"""The ``Ledger``: one host's reservations of running trials, admitted, released and reaped in transactions.

Owns the cross-process transactions (admission in its turn with GPU placement, withdrawal from the queue,
release, reaping of dead owners, settling) and ``read_host``; knows nothing of Optuna, torch or estimates.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from .._backoff import retried
from ..units import check_number, is_int
from ._capacity import HostBudget, HostCapacity, Request, Usage, describe
from ._commit import Committed, Plan, State, commit, fast_try, read_state
from ._db import (
    ENTRIES_OF,
    LOCK_HOST,
    REAPED_OF,
    TICKETS_OF,
    Entry,
    Reaped,
    Ticket,
    add_version_column,
    cannot_open,
    check_ledger_url,
    default_url,
    entries_table,
    entry_of,
    hosts_table,
    metadata,
    open_engine,
    reaped_of,
    reaped_table,
    ticket_of,
)
from ._owners import owner_alive, start_of
from ._queue import TICKET_TTL_S, decide, misfit_of, withdraw

_logger = logging.getLogger("optuna_memprune.ledger")
#: One DEBUG line per ``try_admit`` transaction, with its duration and the CPU time of the thread that ran it
#: (``scripts/bench_faults.py`` reads them).
_txn_logger = logging.getLogger("optuna_memprune.ledger.txn")
T = TypeVar("T")

#: A reaped entry nobody settled (no process of its trial's storage ran since) is forgotten after this long.
_REAPED_KEPT_S = 30 * 24 * 3600.0
#: ... by the first admission of each ``Ledger`` object, then at most once this often.
_FORGET_EVERY_S = 3600.0
#: Commits a try makes on its reads before it reads and decides under the host's lock (each one that found the
#: host's version moved since its read wrote nothing).
_OPTIMISTIC_TRIES = 4


class Ledger:
    """The reservations of the running trials of one host, kept in a database shared by its processes.

    A trial runs only while it holds an ``Entry``. ``try_admit`` (and ``admit``, which waits) reads the host
    (its version, entries and tickets) in one statement, reaps the entries whose owner process is gone, sums
    the rest and inserts one only if RAM, threads and (for ``vram > 0``) one GPU's memory still fit this
    ledger's capacity, in its turn: first come, first served with conservative backfill. A request that
    does not fit takes a ticket in the host's queue (``memprune_ledger_waiting``), kept across its retries
    (same owner and key), and is admitted only if it fits after the room of every older ticket is set aside
    (RAM and threads summed, VRAM placed best fit in order; a resource it does not ask for is not checked): a
    later small request takes no room an earlier one needs, and the earliest waiting request that fits the
    host is never starved. A ticket reserves nothing; it is dropped when its owner is gone or has not tried for
    ``TICKET_TTL_S`` (30 s). What a try decided is committed only if the host's version (in its row of
    ``memprune_ledger_hosts``) is still the one read, bumping it; otherwise it reads and decides again, and
    after four such tries under the host's lock. Commits of one host serialize on SQLite's write lock (``BEGIN
    IMMEDIATE``, WAL journal, 30 s busy timeout) or, on a server, the host row's lock, held for one statement;
    most tries of a waiter write nothing and take no lock. A failed commit leaves no row behind. Every process
    of one ledger database must run a version of this package that commits this way.

    Args:
        budget: A ``HostBudget`` (resolved once, here) or a ``HostCapacity``.
        url: SQLAlchemy URL of the ledger database. Default: SQLite file ``ledger-<host>.sqlite`` in the
            cache directory (``$MEMPRUNE_CACHE_DIR``, else ``~/.cache/optuna-memprune``).
        host: Host id; default ``socket.gethostname()``. Every query filters by it: pseudo-hosts may share
            one database and never see (or reap) each other's entries.

    Notes:
        - Reaped entries are the trials of dead processes, which the caller must end. ``reap`` returns
          what it removed; what ``try_admit`` and ``admit`` removed is kept on this object until
          ``take_reaped`` returns it. Whichever process's transaction reaps an entry gets it, not
          necessarily the one that admitted it, nor one that can end its trial; so every reaped entry is
          also kept in the database (``reaped``, no longer counted in the sums) until a process that
          ended its trial calls ``settle``, or for 30 days.
        - ``entries`` and ``in_use`` read the committed rows, dead owners included until reaped;
          ``waiting`` the queue's tickets.
        - A database that cannot be opened (a corrupted file, a directory that cannot be written) raises
          ``LedgerError`` with one line naming the file and what to do.
        - Processes of one host that use different capacities all check the same sums against their own.
        - On a database server (PostgreSQL, ...), a transaction that loses its connection or cannot get one
          (the server restarting) is retried for up to ``RETRY_S`` (60 s), each retry logged; an admission
          retried after a commit whose answer was lost finds its entry (same owner and key) instead of adding
          a second one. SQLite's errors are raised at once (its lock waits are its busy timeout).
        - GPU indices are NVML's (PCI bus order); CUDA numbers devices fastest-first unless
          ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set for the trial.
        - SQLite's WAL needs a local filesystem (not NFS). Across hosts use PostgreSQL, one ``host`` each.
        - Liveness is judged by pid, so every process of one ``host`` must share one pid namespace
          (containers with their own pids need their own ``host`` and capacity).

    Examples:
        >>> ledger = Ledger(HostBudget(ram="48GiB", gpus=["24GiB"], threads=32))
        >>> entry = ledger.admit(Request(ram=6 * 2**30, vram=10 * 2**30, threads=4), key="trial-7", timeout=600)
        >>> entry.gpu
        0
        >>> ledger.release(entry)
    """

    def __init__(self, budget: HostBudget | HostCapacity, *, url: str | None = None, host: str | None = None) -> None:
        if isinstance(budget, HostBudget):
            budget = budget.resolve()
        elif not isinstance(budget, HostCapacity):
            raise TypeError(f"budget must be a HostBudget or a HostCapacity, but got {budget!r}.")
        host = socket.gethostname() if host is None else host
        if not isinstance(host, str) or not 0 < len(host) <= 255:
            raise ValueError(f"host must be a non-empty str of at most 255 characters, but got {host!r}.")
        self.capacity: HostCapacity = budget
        self.host = host
        default = url is None
        if url is None:
            url = default_url(host, create=True)
        else:
            check_ledger_url(url)
        self.url = url
        self._engine = open_engine(url)
        self._sqlite = sa.engine.make_url(url).get_backend_name() == "sqlite"
        self._pg = self._engine.dialect.name == "postgresql"
        self._pid = os.getpid()
        self._reaped: list[Entry] = []
        self._next_forget = 0.0  # when a commit next deletes reaped entries older than _REAPED_KEPT_S
        self._lock = threading.Lock()
        try:
            self._create_tables()
        except (DBAPIError, OSError) as exc:
            self._engine.dispose()
            raise cannot_open(url, exc, default) from None

    # -- admission -------------------------------------------------------------------------------------

    def try_admit(self, request: Request, key: str, *, owner_pid: int | None = None, wait: bool = True) -> Entry | None:
        """Reserve ``request`` for ``key`` if it fits now in its turn; return the new entry, or None.

        The owner is ``owner_pid`` (default: this process); its entry is reaped once that process is gone.
        Placement: the GPU with the least free memory that still fits (best fit; lowest index on ties).
        On None it keeps (or takes) its place in the host's queue as (owner, ``key``): try again with that key
        within ``TICKET_TTL_S``, or ``withdraw`` it; ``wait=False`` keeps none (one it had is removed).
        """
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request, but got {request!r}.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str, but got {key!r}.")
        pid = os.getpid() if owner_pid is None else owner_pid
        start = start_of(pid)
        if start is None or not owner_alive(pid, start):
            raise ValueError(f"owner_pid must be the pid of a running process, but got {owner_pid!r}.")

        def decide_on(state: State, found: bool) -> tuple[Plan, Entry | None]:
            return decide(state, self.capacity, request, (pid, start), key, wait=wait, found=found)

        # a waiter's try on PostgreSQL that asks for no GPU memory: one statement (``_commit._PG_FAST_TRY``)
        first = None
        if self._pg and wait and request.vram == 0 and not self.misfit(request):
            first = partial(
                fast_try, host=self.host, capacity=self.capacity, request=request, owner=(pid, start), key=key,
                ttl=TICKET_TTL_S,
            )  # fmt: skip
        began, cpu = time.perf_counter(), time.thread_time()
        plan, entry, done, conflicts = self._decide_and_commit(decide_on, first)
        if done is not None and entry is not None and done.entry_id is not None:
            entry = dataclasses.replace(entry, id=done.entry_id)
        # wall and this thread's CPU milliseconds (waits for a CPU apart), and how many commits found the host
        # moved since their read; "refused-unlocked": refused on a read, nothing written, no lock taken
        outcome = "admitted" if entry is not None else "refused" if done is not None else "refused-unlocked"
        took, own = (time.perf_counter() - began) * 1000, (time.thread_time() - cpu) * 1000
        _txn_logger.debug("try_admit %.3f ms %s cpu=%.3f conflicts=%d key=%s", took, outcome, own, conflicts, key)
        reaped = self._reaped_by(plan, done)
        if reaped:
            with self._lock:
                self._reaped.extend(reaped)
        return entry

    def admit(
        self,
        request: Request,
        key: str,
        *,
        timeout: float | None = None,
        poll: float = 0.2,
        owner_pid: int | None = None,
    ) -> Entry:
        """Wait until ``request`` fits, then reserve it (see ``try_admit``) and return the entry.

        Args:
            timeout: Seconds to wait at most (default: no limit); then ``TimeoutError``, its ticket withdrawn.
            poll: Seconds between attempts, > 0 (at most ``TICKET_TTL_S / 2``: the ticket stays live). Default 0.2.

        Raises:
            ValueError: At once, if the request cannot fit even this host with no entries.
            TimeoutError: The request did not fit within ``timeout``.
        """
        check_number(timeout, "timeout", minimum=0, optional=True, expected="a non-negative number of seconds")
        check_number(poll, "poll", minimum=0, open_min=True, expected="a positive number of seconds")
        misfit = self.misfit(request)
        if misfit:
            raise ValueError(f"Request {key!r} can never be admitted on host {self.host!r}: {misfit}.")
        deadline = None if timeout is None else time.monotonic() + timeout
        poll = min(poll, TICKET_TTL_S / 2)
        try:
            while True:
                entry = self.try_admit(request, key, owner_pid=owner_pid)
                if entry is not None:
                    return entry
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"Request {key!r} ({describe(request)}) did not fit host {self.host!r} within {timeout} s; "
                        f"in use: {describe(self.in_use())}, capacity: {describe(self.capacity)}."
                    )
                time.sleep(poll if left is None else min(poll, left))
        except BaseException:  # a timeout, Ctrl-C, a database error: the place in the queue is given up
            try:
                self.withdraw(key, owner_pid=owner_pid)
            except Exception:  # the ticket is dropped after TICKET_TTL_S; the first error is the one raised
                _logger.warning("Withdrawing %r from the queue of host %s failed", key, self.host, exc_info=True)
            raise

    def fits_empty(self, request: Request) -> bool:
        """Whether ``request`` fits this ledger's capacity with no other entry on the host."""
        return not self.misfit(request)

    def withdraw(self, key: str, owner_pid: int | None = None) -> None:
        """Give up the place of ``key`` (owner ``owner_pid``, default: this process) in the host's queue, if any."""
        pid = os.getpid() if owner_pid is None else owner_pid
        self._write(lambda conn, _: withdraw(conn, self.host, pid, key))

    def release(self, entry_or_id: Entry | int) -> None:
        """Remove a reservation; releasing one that is already gone does nothing."""
        entry_id = entry_or_id.id if isinstance(entry_or_id, Entry) else entry_or_id
        if not is_int(entry_id):
            raise TypeError(f"entry_or_id must be an Entry or an int id, but got {entry_or_id!r}.")
        self._write(lambda conn, _: conn.execute(entries_table.delete().where(entries_table.c.id == entry_id)))

    # -- dead owners -----------------------------------------------------------------------------------

    def reap(self) -> list[Entry]:
        """Remove this host's entries whose owner process is gone and return them (not kept for take_reaped;
        kept in ``reaped`` until settled)."""
        plan, _, done, _ = self._decide_and_commit(
            lambda state, _: decide(state, self.capacity, None, (os.getpid(), 0.0), "", wait=False)
        )
        return self._reaped_by(plan, done)

    def reaped(self) -> list[Reaped]:
        """This host's reaped entries not yet settled, oldest first: the trials of dead owners that a
        process able to end them has not ended yet."""
        rows = lambda conn, _: [reaped_of(r) for r in conn.execute(REAPED_OF, {"host": self.host})]  # noqa: E731
        return self._transaction(rows, read=True)

    def settle(self, reaped: Reaped) -> bool:
        """Forget a reaped entry once its trial is ended; False when another process settled it first."""
        if not isinstance(reaped, Reaped):
            raise TypeError(f"reaped must be a Reaped, but got {reaped!r}.")
        delete = reaped_table.delete().where(reaped_table.c.id == reaped.id)
        return self._write(lambda conn, _: conn.execute(delete).rowcount > 0)

    def take_reaped(self) -> list[Entry]:
        """Return, and forget, the entries that ``try_admit`` and ``admit`` of this object reaped."""
        with self._lock:
            out, self._reaped = self._reaped, []
        return out

    # -- reading ---------------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """This host's committed entries, oldest first."""
        return self._transaction(lambda conn, _: self._entries(conn), read=True)

    def in_use(self) -> Usage:
        """The sums of this host's committed entries; ``vram`` has one figure per GPU of the capacity."""
        return self._transaction(lambda conn, _: Usage.of(self._entries(conn), self.capacity), read=True)

    def waiting(self) -> list[Ticket]:
        """This host's queue: its committed tickets, oldest (first in turn) first; gone owners' included."""
        rows = lambda conn, _: [ticket_of(r) for r in conn.execute(TICKETS_OF, {"host": self.host})]  # noqa: E731
        return self._transaction(rows, read=True)

    def close(self) -> None:
        """Close the database connections; the entries stay (release them first)."""
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"Ledger(host={self.host!r}, capacity={self.capacity})"

    # -- private ---------------------------------------------------------------------------------------

    def _connect(self, *, read: bool = False) -> sa.Connection:
        if os.getpid() != self._pid:  # forked: the parent's pooled connections are not ours to use
            self._engine.dispose(close=False)
            self._pid = os.getpid()
        conn = self._engine.connect()
        if not read:
            return conn
        if self._sqlite:  # a deferred BEGIN (see open_engine): one snapshot, waiting for no writer
            return conn.execution_options(memprune_read=True)
        # On a server no BEGIN and COMMIT (two round trips a waiter's try): each statement reads its own
        # snapshot, and what is decided from them is only a refusal (safe, _queue.refused_unlocked) or a figure.
        return conn.execution_options(isolation_level="AUTOCOMMIT")

    def _write(self, work: Callable[[sa.Connection, bool], T]) -> T:
        """``work`` that writes: on a server one statement without BEGIN and COMMIT, on SQLite BEGIN IMMEDIATE."""
        return self._transaction(work, read=not self._sqlite)

    def _write_noting(self, work: Callable[[sa.Connection], T]) -> tuple[T, bool]:
        """``_write`` of ``work``, and whether it was retried: an attempt whose answer was lost may have committed."""
        retried = [False]

        def attempt(conn: sa.Connection, again: bool) -> T:
            retried[0] = retried[0] or again
            return work(conn)

        return self._write(attempt), retried[0]

    def _transaction(self, work: Callable[[sa.Connection, bool], T], *, read: bool = False) -> T:
        """``work(conn, retried)`` in one transaction; on a database server, retried for up to ``RETRY_S``
        while the server cannot be reached (``retried`` is True from the second attempt on)."""

        def once(attempt: int) -> T:
            with self._connect(read=read) as conn, conn.begin():
                return work(conn, attempt > 1)

        def log(exc: BaseException, delay: float, _: int) -> None:
            cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            _logger.warning(
                "The ledger database of host %s cannot be reached (%s); retrying in %.1f s", self.host, cause, delay
            )

        return retried(once, (OperationalError, InterfaceError), log, final=lambda _: self._sqlite)

    def _create_tables(self) -> None:
        try:
            metadata.create_all(self._engine)
        except DBAPIError:  # another process created them between our check and our CREATE
            metadata.create_all(self._engine)
        add_version_column(self._engine)
        try:
            with self._connect() as conn, conn.begin():
                if conn.execute(sa.select(hosts_table.c.host).where(hosts_table.c.host == self.host)).first() is None:
                    conn.execute(hosts_table.insert().values(host=self.host))
        except IntegrityError:  # another process inserted the host row first
            pass

    def _decide_and_commit(
        self,
        decide_on: Callable[[State, bool], tuple[Plan, Entry | None]],
        first: Callable[[sa.Connection], tuple[State, Entry | None, bool]] | None = None,
    ) -> tuple[Plan, Entry | None, Committed | None, int]:
        """Read the host, decide on the read (``decide_on(state, found)``) and commit the plan if the host's version
        is still the one read: the plan, the decided entry, what was committed (None: nothing) and how many commits
        found the version moved. ``first``: the first read, a statement that may write (``fast_try``). The host's
        lock is held only while a commit runs, never while a process decides (a try is one or two round trips on
        a server, against seven with the lock taken first, where a holder descheduled on a loaded host kept every
        other try waiting); after ``_OPTIMISTIC_TRIES`` moved versions, the try reads and decides under the lock.
        ``found``: a write was retried after its connection went away, so it may have committed.
        """
        found, wrote, state = False, False, None
        if first is not None:
            (state, entry, wrote), found = self._write_noting(first)
            if entry is not None:
                return Plan(state.version), entry, Committed(entry.id), 0
        for conflicts in range(_OPTIMISTIC_TRIES):
            if state is None:
                state = self._transaction(lambda conn, _: read_state(conn, self.host), read=True)
            plan, entry = decide_on(state, found)
            if not plan.writes():
                return plan, entry, Committed(None) if wrote else None, conflicts
            done, retried = self._write_noting(partial(commit, host=self.host, plan=plan))
            if done is not None:
                self._forget_old_reaped()
                return plan, entry, done, conflicts
            found, state = found or retried, None

        def locked(conn: sa.Connection, again: bool) -> tuple[Plan, Entry | None, Committed | None]:
            conn.execute(LOCK_HOST, {"host": self.host})  # on SQLite BEGIN IMMEDIATE holds it already
            plan, entry = decide_on(read_state(conn, self.host), found or again)
            return plan, entry, (commit(conn, self.host, plan) if plan.writes() else None)

        plan, entry, done = self._transaction(locked)
        if done is not None:
            self._forget_old_reaped()
        return plan, entry, done, _OPTIMISTIC_TRIES

    def _reaped_by(self, plan: Plan, done: Committed | None) -> list[Entry]:
        """The entries ``done`` reaped (each logged) and the tickets of gone waiters it dropped (logged)."""
        if done is None:
            return []
        if plan.drop:
            keys = ", ".join(t.key for t in plan.drop)
            _logger.info("Dropped %d tickets of waiters gone or silent for %.0f s on host %s: %s", len(plan.drop),
                         TICKET_TTL_S, self.host, keys)  # fmt: skip
        dead = [e for e in plan.reap if e.id in done.reaped]
        if dead:
            keys = ", ".join(e.key for e in dead)
            _logger.info("Reaped %d entries of dead processes on host %s: %s", len(dead), self.host, keys)
        return dead

    def _forget_old_reaped(self) -> None:
        """Delete this host's reaped entries older than ``_REAPED_KEPT_S`` (at most once an ``_FORGET_EVERY_S``)."""
        now = time.time()
        if now < self._next_forget:
            return
        self._next_forget = now + _FORGET_EVERY_S
        old = reaped_table.delete().where(
            reaped_table.c.host == self.host, reaped_table.c.reaped < now - _REAPED_KEPT_S
        )
        self._write(lambda conn, _: conn.execute(old))

    def _entries(self, conn: sa.Connection) -> list[Entry]:
        return [entry_of(r) for r in conn.execute(ENTRIES_OF, {"host": self.host})]

    def misfit(self, request: Request) -> str:
        """Why ``request`` can never fit this host, even with no other entry (``""`` when it can)."""
        return misfit_of(self.capacity, request)
