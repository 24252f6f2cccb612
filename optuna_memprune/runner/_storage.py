"""The runner's calls to the study's storage: retried with backoff, and the storage's fingerprint (which
names it in the host ledger's keys without holding its URL).

Runs in the runner's process (and in a report's); knows nothing of trials, guards or the ledger's rules.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _internals
from .._backoff import RETRY_S, retried

if TYPE_CHECKING:
    import optuna

_logger = logging.getLogger("optuna_memprune.guard")


def retry(what: str, call: Callable[[], Any]) -> Any:
    """``call()``, retried on storage errors for up to ``RETRY_S`` (a database server restarting or failing
    over), with backoff (``_backoff.retried``); each failure is logged, the last raised."""
    import optuna
    import sqlalchemy.exc

    errors = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)

    def log(exc: BaseException, delay: float, attempt: int) -> None:
        cause = str(getattr(exc, "__cause__", None) or exc).strip().splitlines()[0]
        _logger.warning(
            "Storage error while %s (attempt %d, retrying in %.1f s for up to %.0f s in all): %s",
            what,
            attempt,
            delay,
            RETRY_S,
            cause,
        )

    return retried(lambda _: call(), errors, log)


def storage_id(study: optuna.Study) -> str | None:
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
