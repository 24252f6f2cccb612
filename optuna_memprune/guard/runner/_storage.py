"""The runner's calls to the study's storage: retried with backoff, and the storage's fingerprint (which
names it in the host ledger's keys without holding its URL).

Runs in the runner's process (and in a report's); knows nothing of trials, guards or the ledger's rules.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ... import _internals

if TYPE_CHECKING:
    import optuna

_logger = logging.getLogger("optuna_memprune.guard")

_RETRIES = 6           # storage calls: attempts, with backoff 0.1 s x 2^k between them


def retry(what: str, call: Callable[[], Any]) -> Any:
    """``call()``, retried with backoff on storage errors; each failure is logged, the last raised."""
    import optuna
    import sqlalchemy.exc

    errors = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError,
              sqlalchemy.exc.InterfaceError)
    for attempt in range(_RETRIES):
        try:
            return call()
        except errors as exc:
            if attempt == _RETRIES - 1:
                raise
            delay = 0.1 * 2 ** attempt
            _logger.warning("Storage error while %s (attempt %d of %d, retrying in %.1f s): %s",
                            what, attempt + 1, _RETRIES, delay, exc)
            time.sleep(delay)


def storage_id(study: "optuna.Study") -> str | None:
    """A short fingerprint of where the study's storage keeps its data, the same from any process of this
    host: a SQLite or Journal file by its real path, another database by its URL without the password
    (a ledger entry names its storage without holding its URL, which may carry a password). None where
    there is nothing stable to name (in memory)."""
    import sqlalchemy as sa

    where = _internals.storage_location(study)
    if where is None:
        return None
    try:
        url = sa.engine.make_url(where)
    except sa.exc.ArgumentError:  # a Journal file's path
        where = "file:" + os.path.realpath(where)
    else:
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            where = "sqlite:" + os.path.realpath(url.database)
        else:
            where = url.render_as_string(hide_password=True)
    return hashlib.sha1(where.encode()).hexdigest()[:16]
