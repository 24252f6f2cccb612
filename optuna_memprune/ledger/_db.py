"""The ledger's database: its tables, the rows read back from them, and opening an engine on a URL.

Owns the table schema (entries, reaped entries, the waiting queue's tickets, each host's version),
``read_host``, the default SQLite file per host, SQLite's locking set-up and the one-line ``LedgerError`` for a
database that cannot be opened; knows nothing of capacities, admission or liveness.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from ..exceptions import MemPruneError
from ..paths import cache_dir

#: How long a SQLite transaction waits for another process's write lock before it fails.
SQLITE_BUSY_TIMEOUT_S = 30.0

metadata = sa.MetaData()
hosts_table = sa.Table(
    "memprune_ledger_hosts",
    metadata,
    sa.Column("host", sa.String(255), primary_key=True),  # one row per host, locked by every commit
    # Bumped by every commit that admits, queues or reaps on the host (``_commit.py``): a decision taken on a
    # read is committed only if the host's version is still the one read. Added to a database made before it.
    sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
)
entries_table = sa.Table(
    "memprune_ledger_entries",
    metadata,
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
reaped_table = sa.Table(
    "memprune_ledger_reaped",
    metadata,
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
    sa.Column("reaped", sa.Float, nullable=False),  # time.time() when its owner was found dead
    sa.Column("reaped_by", sa.Integer, nullable=False),  # the pid whose transaction reaped it
)


# The queue of a host's waiting requests (``_queue.py``): one ticket per waiting (owner, key), its id the order
# of arrival; a ticket reserves nothing, it only keeps its owner's place in line.
waiting_table = sa.Table(
    "memprune_ledger_waiting",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("host", sa.String(255), nullable=False, index=True),
    sa.Column("owner_pid", sa.Integer, nullable=False),
    sa.Column("owner_start", sa.Float, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("ram", sa.BigInteger, nullable=False),
    sa.Column("vram", sa.BigInteger, nullable=False),
    sa.Column("threads", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),  # time.time() when it joined the queue
    sa.Column("seen", sa.Float, nullable=False),  # time.time() of its owner's latest try
)


def _of_host(table: sa.Table) -> sa.Select[Any]:
    return table.select().where(table.c.host == sa.bindparam("host")).order_by(table.c.id)


#: The columns of ``STATE_OF``'s rows after ``kind``, with their types (a table without one gives NULL).
_STATE_COLUMNS: dict[str, Any] = {
    "id": sa.BigInteger,
    "owner_pid": sa.Integer,
    "owner_start": sa.Float,
    "key": sa.Text,
    "ram": sa.BigInteger,
    "vram": sa.BigInteger,
    "gpu": sa.Integer,
    "threads": sa.Integer,
    "created": sa.Float,
    "seen": sa.Float,
}


def _state_of() -> sa.CompoundSelect[Any]:
    """A host's version, entries and tickets in one statement, so in one snapshot without a transaction: rows
    ``(kind, *_STATE_COLUMNS)``, kind ``"v"`` (its ``id`` the version), ``"e"`` or ``"t"``, each oldest first."""

    def part(kind: str, table: sa.Table, **given: Any) -> sa.Select[Any]:
        cells = [
            given.get(name, table.c[name] if name in table.c else sa.cast(sa.null(), type_)).label(name)
            for name, type_ in _STATE_COLUMNS.items()
        ]
        return sa.select(sa.literal_column(f"'{kind}'").label("kind"), *cells).where(
            table.c.host == sa.bindparam("host")
        )

    version = sa.cast(hosts_table.c.version, sa.BigInteger)
    parts = part("v", hosts_table, id=version), part("e", entries_table), part("t", waiting_table)
    return sa.union_all(*parts).order_by(sa.literal_column("kind"), sa.literal_column("id"))


# The statements every admission runs, built once (building one cost about as much CPU as running it on a
# local server); each takes ``{"host": ...}``. A host's rows oldest first, and its version, entries and tickets.
ENTRIES_OF, REAPED_OF, TICKETS_OF = _of_host(entries_table), _of_host(reaped_table), _of_host(waiting_table)
STATE_OF = _state_of()
LOCK_HOST = sa.select(hosts_table.c.host).where(hosts_table.c.host == sa.bindparam("host")).with_for_update()


class LedgerError(MemPruneError):
    """The ledger's database cannot be opened: a corrupted file, a directory that cannot be written."""


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
    """An entry whose owner died, reaped from the host's reservations and kept until ``Ledger.settle``.

    ``id`` is the row's own id (not the entry's); ``reaped`` is ``time.time()`` when it was reaped and
    ``reaped_by`` the pid of the process whose transaction reaped it.
    """

    id: int
    entry: Entry
    reaped: float
    reaped_by: int


@dataclass(frozen=True)
class Ticket:
    """A waiting request's place in its host's queue: a row of ``memprune_ledger_waiting``, oldest id first.

    It reserves nothing. ``created`` is when it joined the queue and ``seen`` its owner's latest try (both
    ``time.time()``).
    """

    id: int
    host: str
    owner_pid: int
    owner_start: float
    key: str
    ram: int
    vram: int
    threads: int
    created: float
    seen: float


def add_version_column(engine: sa.Engine) -> None:
    """Give a hosts table made before ``version`` existed its column (0 on every host)."""
    for attempt in range(2):
        try:
            with engine.begin() as conn:
                if "version" not in {c["name"] for c in sa.inspect(conn).get_columns(hosts_table.name)}:
                    conn.exec_driver_sql(f"ALTER TABLE {hosts_table.name} ADD COLUMN version BIGINT NOT NULL DEFAULT 0")
            return
        except DBAPIError:  # another process added it between our check and our ALTER
            if attempt:
                raise


def ticket_of(row: Any) -> Ticket:
    return Ticket(**{f.name: getattr(row, f.name) for f in fields(Ticket)})


def entry_of(row: Any) -> Entry:
    return Entry(**{f.name: getattr(row, f.name) for f in fields(Entry)})


def reaped_of(row: Any) -> Reaped:
    entry = Entry(
        id=row.entry_id,
        host=row.host,
        owner_pid=row.owner_pid,
        owner_start=row.owner_start,
        key=row.key,
        ram=row.ram,
        vram=row.vram,
        gpu=row.gpu,
        threads=row.threads,
        created=row.created,
    )
    return Reaped(id=row.id, entry=entry, reaped=row.reaped, reaped_by=row.reaped_by)


def default_url(host: str | None = None, *, create: bool = False) -> str:
    """The default ledger database of ``host`` (default: this host's name): a SQLite file in the cache dir,
    which ``create`` makes (``LedgerError`` when it cannot)."""
    host = socket.gethostname() if host is None else host
    directory = cache_dir()
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = "is a file, not a directory" if directory.is_file() else f"cannot be created ({exc.strerror or exc})"
        raise LedgerError(
            f"the cache directory {directory} of the host ledger {what}: set MEMPRUNE_CACHE_DIR to a writable directory"
        ) from None
    return "sqlite:///" + str(directory / f"ledger-{re.sub(r'[^A-Za-z0-9._-]', '_', host)}.sqlite")


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL, None for another database or an in-memory one."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def cannot_open(url: str, exc: BaseException, default: bool) -> LedgerError:
    """The one-line error for a ledger database that cannot be opened, saying what to do about it."""
    cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    elsewhere = "set MEMPRUNE_CACHE_DIR to another directory" if default else "give another ledger URL"
    path = sqlite_path(url)
    if path is None:
        where = sa.engine.make_url(url).render_as_string(hide_password=True)
        return LedgerError(f"cannot open the host ledger database {where}: {cause}")
    if "not a database" in cause or "malformed" in cause:
        return LedgerError(
            f"the host ledger {path} is not a readable SQLite database ({cause}): delete it (it "
            f"holds only the reservations of this host's running trials) or {elsewhere}"
        )
    return LedgerError(f"cannot open the host ledger {path} ({cause}): make its directory writable or {elsewhere}")


def check_ledger_url(url: Any) -> None:
    """A ledger URL SQLAlchemy can open a dialect for, else ValueError naming it (before anything is created)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"the ledger URL must be a non-empty SQLAlchemy database URL, but got {url!r}")
    try:
        sa.engine.make_url(url).get_dialect()
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"{url!r} is not a database URL SQLAlchemy can open ({cause}): give e.g. "
            "sqlite:////path/ledger.sqlite or postgresql+psycopg://user@host/db"
        ) from None


def open_engine(url: str) -> sa.Engine:
    if sa.engine.make_url(url).get_backend_name() != "sqlite":
        # Statements after the host-row lock must see rows committed while we waited for it.
        # No ``pool_pre_ping``: its ping is a round trip on every checkout, and a pooled connection the server
        # dropped fails its first statement with a disconnect that invalidates the pool, which
        # ``Ledger._transaction`` retries on a new connection.
        # psycopg 3 prepares a statement on a connection from its first run, not its sixth: a ledger's connection
        # runs the same two statements (read and commit), and planning the commit took 0.34 ms against 0.12.
        psycopg3 = sa.engine.make_url(url).get_driver_name() == "psycopg"
        connect_args = {"prepare_threshold": 0} if psycopg3 else {}
        return sa.create_engine(url, isolation_level="READ COMMITTED", connect_args=connect_args)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

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


def read_host(url: str | None = None, host: str | None = None) -> tuple[list[Entry], list[Reaped]]:
    """A host's entries and unsettled reaped entries, read without creating anything: ``([], [])`` when the
    database (default: this host's file in the cache dir) or its tables do not exist.

    Raises ``LedgerError`` when the database cannot be read.
    """
    host = socket.gethostname() if host is None else host
    default = url is None
    url = default_url(host) if url is None else url
    path = sqlite_path(url)
    if path is not None and not os.path.isfile(path):
        return [], []
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S} if path else {})
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            if entries_table.name not in tables:
                return [], []
            rows = conn.execute(ENTRIES_OF, {"host": host})
            entries = [entry_of(r) for r in rows]
            reaped = []
            if reaped_table.name in tables:
                reaped = [reaped_of(r) for r in conn.execute(REAPED_OF, {"host": host})]
            return entries, reaped
    except DBAPIError as exc:
        raise cannot_open(url, exc, default) from None
    finally:
        engine.dispose()
