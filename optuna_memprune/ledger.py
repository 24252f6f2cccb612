"""Per-host ledger of the reservations of running trials: admission, GPU placement, reaping of dead owners.

Owns the ledger tables and their cross-process transactions; knows nothing of Optuna, torch or estimates.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import psutil
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError

from .exceptions import MemPruneError
from .paths import cache_dir
from .units import check_int, check_number, format_bytes, is_int, parse_bytes

__all__ = ["HostBudget", "HostCapacity", "Request", "Entry", "Reaped", "Usage", "Ledger", "LedgerError", "owner_alive",
           "default_url", "read_host"]

_logger = logging.getLogger("optuna_memprune.ledger")

#: How long a SQLite transaction waits for another process's write lock before it fails.
_SQLITE_BUSY_TIMEOUT_S = 30.0
#: Two start times of one process agree within this (psutil's create_time has clock-tick resolution).
_START_TOLERANCE_S = 0.01
#: On Linux psutil's create_time is /proc/stat's btime (whole seconds, moved by a wall-clock step) plus the
#: start since boot; a whole-second difference up to this size is the same process after a clock step.
_CLOCK_STEP_S = 10
#: A reaped entry nobody settled (no process of its trial's storage ran since) is forgotten after this long.
_REAPED_KEPT_S = 30 * 24 * 3600.0

_metadata = sa.MetaData()
_hosts = sa.Table(
    "memprune_ledger_hosts", _metadata,
    sa.Column("host", sa.String(255), primary_key=True),  # one row per host, locked by every admission
)
_entries = sa.Table(
    "memprune_ledger_entries", _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("host", sa.String(255), nullable=False, index=True),
    sa.Column("owner_pid", sa.Integer, nullable=False),
    sa.Column("owner_start", sa.Float, nullable=False),
    sa.Column("key", sa.Text, nullable=False),  # the caller's, e.g. JSON naming the study and trial
    sa.Column("ram", sa.BigInteger, nullable=False),
    sa.Column("vram", sa.BigInteger, nullable=False),
    sa.Column("gpu", sa.Integer, nullable=True),
    sa.Column("threads", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)
# Entries reaped from dead owners, kept until a process that can end their trials settles them: the
# process whose admission reaped an entry may not be able to (its trial lives in another study database).
_reaped = sa.Table(
    "memprune_ledger_reaped", _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("entry_id", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False, index=True),
    sa.Column("owner_pid", sa.Integer, nullable=False),
    sa.Column("owner_start", sa.Float, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("ram", sa.BigInteger, nullable=False),
    sa.Column("vram", sa.BigInteger, nullable=False),
    sa.Column("gpu", sa.Integer, nullable=True),
    sa.Column("threads", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("reaped", sa.Float, nullable=False),      # time.time() when its owner was found dead
    sa.Column("reaped_by", sa.Integer, nullable=False),  # the pid whose transaction reaped it
)


class LedgerError(MemPruneError):
    """The ledger's database cannot be opened: a corrupted file, a directory that cannot be written."""


@dataclass(frozen=True)
class HostCapacity:
    """What the running trials of one host may reserve in all: bytes and counts, ``None`` = unlimited.

    ``gpus[i]`` is the memory of GPU index ``i`` (NVML's index; see :class:`Ledger` on CUDA's order).
    """

    ram: int | None
    gpus: tuple[int, ...] = ()
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.ram is not None:
            check_int(self.ram, "HostCapacity.ram", minimum=0)
        object.__setattr__(self, "gpus", tuple(check_int(g, f"HostCapacity.gpus[{i}]", minimum=0) for i, g in enumerate(self.gpus)))
        check_int(self.threads, "HostCapacity.threads", minimum=1, optional=True)


@dataclass(frozen=True)
class HostBudget:
    """The host's resources for parallel trials, as a user gives them; :meth:`resolve` makes them concrete.

    Args:
        ram: Host RAM for trials: bytes, a size such as ``"48GiB"``, ``"auto"`` (default: what
            ``psutil.virtual_memory().available`` says when resolved) or ``None`` (unlimited).
        gpus: Memory per GPU index: a sequence of sizes (``["8GiB", "16GiB"]``), ``"auto"`` (default: NVML's
            totals; no GPUs where NVML is missing) or ``None``/``[]`` (no GPUs).
        headroom: Fraction of every RAM and GPU figure kept free, in [0, 1). Default 0.1.
        threads: Total threads of the running trials, or ``None`` (default: unlimited).

    Notes:
        - ``"auto"`` RAM is *available* memory at the moment of :meth:`resolve` (psutil's ``available``,
          not ``free``: page cache counts as usable). Resolve before the trials start: memory the trials
          already hold is not available, so resolving later counts it twice.

    Example:
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
        check_number(self.headroom, "HostBudget.headroom", minimum=0, maximum=1, open_max=True,
                     expected="a fraction in [0, 1)")
        check_int(self.threads, "HostBudget.threads", minimum=1, optional=True)

    def resolve(self) -> HostCapacity:
        """Return the concrete capacity: each RAM and GPU figure x (1 - headroom); ``"auto"`` read now."""
        keep = 1.0 - self.headroom
        ram = psutil.virtual_memory().available if self.ram == "auto" else self.ram
        gpus = _nvml_totals() if self.gpus == "auto" else self.gpus
        return HostCapacity(
            ram=None if ram is None else int(ram * keep),
            gpus=tuple(int(g * keep) for g in gpus),
            threads=self.threads,
        )


def _nvml_totals() -> tuple[int, ...]:
    """Total memory of every GPU NVML sees, by index; () without NVML. A device NVML cannot read counts 0."""
    from .monitor import gpu_reader  # pynvml is imported on first use

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


@dataclass(frozen=True)
class Entry:
    """One reservation: a row of the ledger. ``gpu`` is the GPU index it was placed on, None without VRAM.

    The owner is the process ``(owner_pid, owner_start)``, ``owner_start`` being psutil's ``create_time``;
    ``created`` is ``time.time()`` at admission.
    """

    id: int
    host: str
    owner_pid: int
    owner_start: float
    key: str
    ram: int
    vram: int
    gpu: int | None
    threads: int
    created: float


class Reaped(NamedTuple):
    """An entry whose owner died, reaped from the host's reservations and kept until :meth:`Ledger.settle`.

    ``id`` is the row's own id (not the entry's); ``reaped`` is ``time.time()`` when it was reaped and
    ``reaped_by`` the pid of the process whose transaction reaped it.
    """

    id: int
    entry: Entry
    reaped: float
    reaped_by: int


class Usage(NamedTuple):
    """The sum of a host's reservations: bytes of RAM, threads, bytes per GPU index."""

    ram: int
    threads: int
    vram: tuple[int, ...]


def owner_alive(pid: int, start: float) -> bool:
    """Whether the process ``(pid, start)`` still runs: the pid exists, is not a zombie and started at ``start``.

    A pid alone is not an identity: the kernel gives it to a new process after the owner exits, and the new
    one has another start time. ``start`` is psutil's ``create_time`` and must agree within 0.01 s; on
    Linux a difference of a whole number of seconds (up to 10) also agrees, since a wall-clock step moves
    the boot time psutil adds to every start.
    """
    try:
        proc = psutil.Process(pid)
        diff = proc.create_time() - start
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:  # it exists; we cannot look closer
        return True
    if abs(diff) <= _START_TOLERANCE_S:
        return True
    steps = round(diff)
    return sys.platform.startswith("linux") and abs(steps) <= _CLOCK_STEP_S and abs(diff - steps) <= _START_TOLERANCE_S


def _start_of(pid: Any) -> float | None:
    """psutil's ``create_time`` of ``pid``, or None when there is no such process."""
    if not is_int(pid) or pid <= 0:
        return None
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _entry(row: Any) -> Entry:
    return Entry(id=row.id, host=row.host, owner_pid=row.owner_pid, owner_start=row.owner_start, key=row.key,
                 ram=row.ram, vram=row.vram, gpu=row.gpu, threads=row.threads, created=row.created)


def _reaped_of(row: Any) -> Reaped:
    entry = Entry(id=row.entry_id, host=row.host, owner_pid=row.owner_pid, owner_start=row.owner_start, key=row.key,
                  ram=row.ram, vram=row.vram, gpu=row.gpu, threads=row.threads, created=row.created)
    return Reaped(id=row.id, entry=entry, reaped=row.reaped, reaped_by=row.reaped_by)


def default_url(host: str | None = None) -> str:
    """The default ledger database of ``host`` (default: this host's name): a SQLite file in the cache dir."""
    host = socket.gethostname() if host is None else host
    return "sqlite:///" + str(cache_dir() / f"ledger-{re.sub(r'[^A-Za-z0-9._-]', '_', host)}.sqlite")


def _sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL, None for another database or an in-memory one."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def _cannot_open(url: str, exc: BaseException, default: bool) -> LedgerError:
    """The one-line error for a ledger database that cannot be opened, saying what to do about it."""
    cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    elsewhere = "set MEMPRUNE_CACHE_DIR to another directory" if default else "give another ledger URL"
    path = _sqlite_path(url)
    if path is None:
        where = sa.engine.make_url(url).render_as_string(hide_password=True)
        return LedgerError(f"cannot open the host ledger database {where}: {cause}")
    if "not a database" in cause or "malformed" in cause:
        return LedgerError(f"the host ledger {path} is not a readable SQLite database ({cause}): delete it (it "
                           f"holds only the reservations of this host's running trials) or {elsewhere}")
    return LedgerError(f"cannot open the host ledger {path} ({cause}): make its directory writable or {elsewhere}")


def _engine(url: str) -> sa.Engine:
    if sa.engine.make_url(url).get_backend_name() != "sqlite":
        # Statements after the host-row lock must see rows committed while we waited for it.
        return sa.create_engine(url, isolation_level="READ COMMITTED", pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})

    # SQLAlchemy's recipe for real transactions with pysqlite: the driver's own BEGIN handling off, our
    # BEGIN on begin. IMMEDIATE takes the write lock at once, so two admissions never read the same sums.
    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")  # readers do not wait for the writer
        cursor.execute("PRAGMA synchronous = NORMAL")  # WAL stays consistent; a power cut may lose the last commits
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("memprune_read") else "BEGIN IMMEDIATE")

    return engine


class Ledger:
    """The reservations of the running trials of one host, kept in a database shared by its processes.

    A trial runs only while it holds an :class:`Entry`. :meth:`try_admit` (and :meth:`admit`, which waits)
    inserts one in a single transaction that first reaps the host's entries whose owner process is gone,
    then sums the rest and inserts only if RAM, threads and (for ``vram > 0``) one GPU's memory still fit
    this ledger's capacity. Admissions of one host serialize on a lock: SQLite's write lock
    (``BEGIN IMMEDIATE``, WAL journal, 30 s busy timeout) or, on other databases, ``SELECT ... FOR UPDATE``
    of the host's row in ``memprune_ledger_hosts``. A transaction that fails leaves no row behind.

    Args:
        budget: A :class:`HostBudget` (resolved once, here) or a :class:`HostCapacity`.
        url: SQLAlchemy URL of the ledger database. Default: SQLite file ``ledger-<host>.sqlite`` in the
            cache directory (``$MEMPRUNE_CACHE_DIR``, else ``~/.cache/optuna-memprune``).
        host: Host id; default ``socket.gethostname()``. Every query filters by it: pseudo-hosts may share
            one database and never see (or reap) each other's entries.

    Notes:
        - Reaped entries are the trials of dead processes, which the caller must end. :meth:`reap` returns
          what it removed; what :meth:`try_admit` and :meth:`admit` removed is kept on this object until
          :meth:`take_reaped` returns it. Whichever process's transaction reaps an entry gets it, not
          necessarily the one that admitted it, nor one that can end its trial; so every reaped entry is
          also kept in the database (:meth:`reaped`, no longer counted in the sums) until a process that
          ended its trial calls :meth:`settle`, or for 30 days.
        - :meth:`entries` and :meth:`in_use` read the committed rows, dead owners included until reaped.
        - A database that cannot be opened (a corrupted file, a directory that cannot be written) raises
          :class:`LedgerError` with one line naming the file and what to do.
        - Processes of one host that use different capacities all check the same sums against their own.
        - GPU indices are NVML's (PCI bus order); CUDA numbers devices fastest-first unless
          ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set for the trial.
        - SQLite's WAL needs a local filesystem (not NFS). Across hosts use PostgreSQL, one ``host`` each.
        - Liveness is judged by pid, so every process of one ``host`` must share one pid namespace
          (containers with their own pids need their own ``host`` and capacity).

    Example:
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
        if default:
            directory = cache_dir()
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                what = "is a file, not a directory" if directory.is_file() else f"cannot be created ({exc.strerror or exc})"
                raise LedgerError(f"the cache directory {directory} of the host ledger {what}: set MEMPRUNE_CACHE_DIR "
                                  "to a writable directory") from None
            url = default_url(host)
        self.url = url
        self._engine = _engine(url)
        self._pid = os.getpid()
        self._reaped: list[Entry] = []
        self._lock = threading.Lock()
        try:
            self._create_tables()
        except (DBAPIError, OSError) as exc:
            self._engine.dispose()
            raise _cannot_open(url, exc, default) from None

    # -- admission -------------------------------------------------------------------------------------

    def try_admit(self, request: Request, key: str, *, owner_pid: int | None = None) -> Entry | None:
        """Reserve ``request`` for ``key`` if it fits now; return the new entry, or None (nothing written).

        The owner is ``owner_pid`` (default: this process); its entry is reaped once that process is gone.
        Placement: the GPU with the least free memory that still fits (best fit; lowest index on ties).
        """
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request, but got {request!r}.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str, but got {key!r}.")
        pid = os.getpid() if owner_pid is None else owner_pid
        start = _start_of(pid)
        if start is None or not owner_alive(pid, start):
            raise ValueError(f"owner_pid must be the pid of a running process, but got {owner_pid!r}.")
        with self._connect() as conn, conn.begin():
            reaped = self._reap(conn)
            used = self._usage(conn)
            gpu = self._place(request, used)
            entry = None
            if gpu is not False:
                row = dict(host=self.host, owner_pid=pid, owner_start=start, key=key, ram=request.ram,
                           vram=request.vram, gpu=gpu, threads=request.threads, created=time.time())
                result = conn.execute(_entries.insert().values(**row))
                entry = Entry(id=result.inserted_primary_key[0], **row)
        if reaped:
            with self._lock:
                self._reaped.extend(reaped)
        return entry

    def admit(self, request: Request, key: str, *, timeout: float | None = None, poll: float = 0.2,
              owner_pid: int | None = None) -> Entry:
        """Wait until ``request`` fits, then reserve it (see :meth:`try_admit`) and return the entry.

        Args:
            timeout: Seconds to wait at most (default: no limit); then ``TimeoutError``.
            poll: Seconds between attempts, > 0. Default 0.2.

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

    def fits_empty(self, request: Request) -> bool:
        """Whether ``request`` fits this ledger's capacity with no other entry on the host."""
        return not self.misfit(request)

    def release(self, entry_or_id: Entry | int) -> None:
        """Remove a reservation; releasing one that is already gone does nothing."""
        entry_id = entry_or_id.id if isinstance(entry_or_id, Entry) else entry_or_id
        if not is_int(entry_id):
            raise TypeError(f"entry_or_id must be an Entry or an int id, but got {entry_or_id!r}.")
        with self._connect() as conn, conn.begin():
            conn.execute(_entries.delete().where(_entries.c.id == entry_id))

    # -- dead owners -----------------------------------------------------------------------------------

    def reap(self) -> list[Entry]:
        """Remove this host's entries whose owner process is gone and return them (not kept for take_reaped;
        kept in :meth:`reaped` until settled)."""
        with self._connect() as conn, conn.begin():
            return self._reap(conn)

    def reaped(self) -> list[Reaped]:
        """This host's reaped entries not yet settled, oldest first: the trials of dead owners that a
        process able to end them has not ended yet."""
        with self._connect(read=True) as conn, conn.begin():
            rows = conn.execute(_reaped.select().where(_reaped.c.host == self.host).order_by(_reaped.c.id))
            return [_reaped_of(r) for r in rows]

    def settle(self, reaped: Reaped) -> bool:
        """Forget a reaped entry once its trial is ended; False when another process settled it first."""
        if not isinstance(reaped, Reaped):
            raise TypeError(f"reaped must be a Reaped, but got {reaped!r}.")
        with self._connect() as conn, conn.begin():
            return conn.execute(_reaped.delete().where(_reaped.c.id == reaped.id)).rowcount > 0

    def take_reaped(self) -> list[Entry]:
        """Return, and forget, the entries that :meth:`try_admit` and :meth:`admit` of this object reaped."""
        with self._lock:
            out, self._reaped = self._reaped, []
        return out

    # -- reading ---------------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """This host's committed entries, oldest first."""
        with self._connect(read=True) as conn, conn.begin():
            rows = conn.execute(_entries.select().where(_entries.c.host == self.host).order_by(_entries.c.id))
            return [_entry(r) for r in rows]

    def in_use(self) -> Usage:
        """The sums of this host's committed entries; ``vram`` has one figure per GPU of the capacity."""
        with self._connect(read=True) as conn, conn.begin():
            return self._usage(conn)

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
        return conn.execution_options(memprune_read=True) if read else conn

    def _create_tables(self) -> None:
        try:
            _metadata.create_all(self._engine)
        except DBAPIError:  # another process created them between our check and our CREATE
            _metadata.create_all(self._engine)
        try:
            with self._connect() as conn, conn.begin():
                if conn.execute(sa.select(_hosts.c.host).where(_hosts.c.host == self.host)).first() is None:
                    conn.execute(_hosts.insert().values(host=self.host))
        except IntegrityError:  # another process inserted the host row first
            pass

    def _lock_host(self, conn: sa.Connection) -> None:
        # SQLite renders no FOR UPDATE: there BEGIN IMMEDIATE already holds the database's write lock.
        conn.execute(sa.select(_hosts.c.host).where(_hosts.c.host == self.host).with_for_update())

    def _reap(self, conn: sa.Connection) -> list[Entry]:
        self._lock_host(conn)
        rows = conn.execute(_entries.select().where(_entries.c.host == self.host).order_by(_entries.c.id))
        dead = [_entry(r) for r in rows if not owner_alive(r.owner_pid, r.owner_start)]
        now = time.time()
        if dead:
            conn.execute(_entries.delete().where(_entries.c.id.in_([e.id for e in dead])))
            conn.execute(_reaped.insert(), [
                dict(entry_id=e.id, host=e.host, owner_pid=e.owner_pid, owner_start=e.owner_start, key=e.key,
                     ram=e.ram, vram=e.vram, gpu=e.gpu, threads=e.threads, created=e.created, reaped=now,
                     reaped_by=os.getpid()) for e in dead])
        conn.execute(_reaped.delete().where(_reaped.c.host == self.host, _reaped.c.reaped < now - _REAPED_KEPT_S))
        if dead:
            _logger.info("Reaped %d entries of dead processes on host %s: %s",
                         len(dead), self.host, ", ".join(e.key for e in dead))
        return dead

    def _usage(self, conn: sa.Connection) -> Usage:
        c = _entries.c
        totals = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(c.ram), 0), sa.func.coalesce(sa.func.sum(c.threads), 0))
            .where(c.host == self.host)
        ).one()
        vram = [0] * len(self.capacity.gpus)
        per_gpu = conn.execute(
            sa.select(c.gpu, sa.func.sum(c.vram)).where(c.host == self.host, c.gpu.is_not(None)).group_by(c.gpu)
        )
        for gpu, total in per_gpu:
            if 0 <= gpu < len(vram):  # an entry placed by a ledger that saw more GPUs is not ours to count
                vram[gpu] = int(total)
        return Usage(ram=int(totals[0]), threads=int(totals[1]), vram=tuple(vram))

    def _place(self, request: Request, used: Usage) -> int | None | bool:
        """The GPU index for ``request`` given ``used``, None when it needs no GPU, False when it does not fit."""
        cap = self.capacity
        if cap.ram is not None and used.ram + request.ram > cap.ram:
            return False
        if cap.threads is not None and used.threads + request.threads > cap.threads:
            return False
        if request.vram == 0:
            return None
        free = [(total - u, i) for i, (total, u) in enumerate(zip(cap.gpus, used.vram)) if total - u >= request.vram]
        return min(free)[1] if free else False

    def misfit(self, request: Request) -> str:
        """Why ``request`` can never fit this host, even with no other entry (``""`` when it can)."""
        cap = self.capacity
        if cap.ram is not None and request.ram > cap.ram:
            return f"ram {format_bytes(request.ram)} > capacity {format_bytes(cap.ram)}"
        if cap.threads is not None and request.threads > cap.threads:
            return f"threads {request.threads} > capacity {cap.threads}"
        if request.vram > 0 and not cap.gpus:
            return f"vram {format_bytes(request.vram)} asked, but the host has no GPU"
        if request.vram > 0 and request.vram > max(cap.gpus):
            largest = format_bytes(max(cap.gpus))
            return f"vram {format_bytes(request.vram)} > the largest GPU's capacity {largest}"
        return ""


def read_host(url: str | None = None, host: str | None = None) -> tuple[list[Entry], list[Reaped]]:
    """A host's entries and unsettled reaped entries, read without creating anything: ``([], [])`` when the
    database (default: this host's file in the cache dir) or its tables do not exist.

    Raises :class:`LedgerError` when the database cannot be read.
    """
    host = socket.gethostname() if host is None else host
    default = url is None
    url = default_url(host) if default else url
    path = _sqlite_path(url)
    if path is not None and not os.path.isfile(path):
        return [], []
    engine = sa.create_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S} if path else {})
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            if _entries.name not in tables:
                return [], []
            rows = conn.execute(_entries.select().where(_entries.c.host == host).order_by(_entries.c.id))
            entries = [_entry(r) for r in rows]
            reaped = []
            if _reaped.name in tables:
                rows = conn.execute(_reaped.select().where(_reaped.c.host == host).order_by(_reaped.c.id))
                reaped = [_reaped_of(r) for r in rows]
            return entries, reaped
    except DBAPIError as exc:
        raise _cannot_open(url, exc, default) from None
    finally:
        engine.dispose()


def describe(x: Request | Usage | HostCapacity) -> str:
    """``ram=..., threads=..., vram=...`` in human sizes."""
    vram = getattr(x, "vram", None)
    if vram is None:
        vram = x.gpus
    parts = [f"ram={'unlimited' if x.ram is None else format_bytes(x.ram)}",
             f"threads={'unlimited' if x.threads is None else x.threads}"]
    if isinstance(vram, tuple):
        parts.append("vram=[" + ", ".join(format_bytes(v) for v in vram) + "]")
    else:
        parts.append(f"vram={format_bytes(vram)}")
    return ", ".join(parts)
