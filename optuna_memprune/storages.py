"""Opening an Optuna storage from what a user types: an RDB URL, a Journal file (PATH.log, journal:PATH) or
the path of an existing SQLite file.

Owns the accepted forms, how they are shown and their one-line errors; knows nothing of guards or reports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .exceptions import MemPruneError

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

#: The environment variable Optuna's own CLI reads when no storage is given.
ENV_VAR = "OPTUNA_STORAGE"
_JOURNAL = "journal:"


class StorageError(MemPruneError):
    """A storage that cannot be opened: a URL that is none, a missing file, a file that holds no storage."""


def journal_path(url: str) -> str | None:
    """The file of a Journal storage (``journal:PATH``, or a path ending in ``.log``); None for an RDB URL."""
    if url.startswith(_JOURNAL):
        return url[len(_JOURNAL) :]
    if url.endswith(".log") and "://" not in url:
        return url
    return None


_SQLITE_HEADER = b"SQLite format 3\x00"


def _named_form(text: str) -> bool:
    """Whether ``text`` says which kind of storage it is: a URL's scheme, or a Journal file's form."""
    return "://" in text or journal_path(text) is not None


def as_url(text: str) -> str:
    """What a user typed as a storage, as a URL: the path of an existing SQLite file (``study.db``, as
    ``memprune report study.db`` is typed) becomes ``sqlite:///`` and its absolute path; anything else is
    returned as given (a URL, a Journal file; opening it says what is wrong)."""
    if _named_form(text):
        return text
    try:
        with open(text, "rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError:
        return text
    return f"sqlite:///{Path(text).resolve()}" if header == _SQLITE_HEADER else text


def hint(url: str) -> str:
    """The forms a storage takes, for an error on ``url`` that has no scheme (a bare path or name); ``""``
    otherwise."""
    if _named_form(url):
        return ""
    return f" (a SQLite file is written sqlite:///{url}, a Journal file PATH.log or journal:PATH)"


def open_storage(url: str, *, existing: bool = False) -> BaseStorage:
    """The Optuna storage at ``url``: ``JournalStorage(JournalFileBackend(path))`` for a Journal file (as
    rl-zoo3 opens one), else what ``optuna.create_study(storage=url)`` would open.

    ``existing=True`` opens it to read only: a missing file (SQLite or Journal) is an error, not a new empty
    one, no tables are created, and the study names are read once, so that a file that is no storage fails
    here. Every such failure is a ``StorageError`` with one line that names what was wrong.
    """
    import optuna

    if not existing:
        check_writable(url)
    path = journal_path(url)
    if path is not None:
        if existing and not Path(path).is_file():
            raise StorageError(f"no Journal file at {path!r} (from {url})")
        from optuna.storages.journal import JournalFileBackend

        try:
            storage = optuna.storages.JournalStorage(JournalFileBackend(path))
            if existing:
                optuna.get_all_study_names(storage)
        except Exception as exc:  # noqa: BLE001 - any failure to replay the log is the file's
            raise StorageError(f"cannot read the Optuna storage at {url}: {first_line(exc)}") from None
        return storage
    if not existing:
        return optuna.storages.get_storage(url)
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        shown = parsed.render_as_string(hide_password=True)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's URL
        raise StorageError(f"not a storage URL: {url!r} ({first_line(exc)}){hint(url)}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).is_file():
            raise StorageError(f"no SQLite file at {parsed.database!r} (from {shown})")
    try:
        rdb = optuna.storages.RDBStorage(url, skip_table_creation=True)
        optuna.get_all_study_names(rdb)
    except Exception as exc:  # noqa: BLE001 - drivers raise their own types; the message is what matters
        raise StorageError(f"cannot read the Optuna storage at {shown}: {first_line(exc)}") from None
    return rdb


def check_writable(url: str) -> None:
    """``StorageError`` naming the cause when the file of a SQLite or Journal ``url`` cannot be written: the
    file is read-only, or its directory is (SQLite writes its journal beside the file, Journal storage its
    lock file), or is missing. Checked before anything is written, so the cause is the one reported (a write
    that fails later reaches the user as Optuna's guess, "exceeding max length"). Nothing for a server URL."""
    path = journal_path(url)
    kind = "Journal file"
    if path is None:
        kind = "SQLite file"
        try:
            from sqlalchemy.engine import make_url

            parsed = make_url(url)
        except Exception:  # noqa: BLE001 - not a URL: opening it reports that
            return
        if (
            parsed.get_backend_name() != "sqlite"
            or parsed.database in (None, "", ":memory:")
            or parsed.database.startswith("file:")
        ):
            return
        path = parsed.database
    file = Path(path)
    directory = file.parent
    if file.exists() and not os.access(file, os.W_OK):
        raise StorageError(
            f"the {kind} {path!r} is read-only (from {shown(url)}): make it writable, or copy "
            "it to a writable place and use the copy"
        )
    if not directory.is_dir():
        raise StorageError(f"cannot create the {kind} {path!r} (from {shown(url)}): no directory {str(directory)!r}")
    if not os.access(directory, os.W_OK | os.X_OK):
        beside = "its journal" if kind == "SQLite file" else "its lock file"
        raise StorageError(
            f"the directory of the {kind} {path!r} is read-only (from {shown(url)}): the storage "
            f"writes {beside} beside the file; make the directory writable, or use a copy elsewhere"
        )


def shown(url: str) -> str:
    """``url`` as it may be printed: an RDB URL's password hidden; anything else as given."""
    if journal_path(url) is not None:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: nothing to hide
        return url


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, with the driver's own error when Optuna wrapped one."""

    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")

    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(exc).__name__ == "StorageInternalError":
        return line(cause)  # Optuna's own words guess at the cause ("exceeding max length"); the driver knows
    return line(exc) + (f" ({line(cause)})" if cause is not None else "")
