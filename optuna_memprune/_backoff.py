"""How long to wait between attempts to reach a database server that cannot be reached (restarting, failing
over), and for how long in all: the study's storage (``runner/_storage.py``) and the host ledger's
(``ledger/_ledger.py``).

Each wait is drawn at random in the upper half of a span that doubles from 0.1 s up to 2 s. A server's
restart ends every connection at once, so without the draw every process waiting on it tried again at the
same moments and came back all at once: in the fault drill (64 runners, ``scripts/bench_faults.py``) 51 of
58 runners that had waited reconnected within the same half second.

Owns the schedule and the loop that follows it (``retried``); knows nothing of what is retried.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: Calls are retried for this long in all.
RETRY_S = 60.0
FIRST_S, LONGEST_S = 0.1, 2.0


def waits(rng: random.Random | None = None) -> Iterator[float]:
    """The waits before each retry: the n-th at random in [d/2, d] where d = min(0.1 s x 2^n, 2 s).

    Examples:
        >>> w = waits(random.Random(0))
        >>> [round(next(w), 3) for _ in range(7)]
        [0.092, 0.176, 0.284, 0.504, 1.209, 1.405, 1.784]
    """
    draw = (rng or random).uniform
    span = FIRST_S
    while True:
        yield draw(span / 2, span)
        span = min(2 * span, LONGEST_S)


def retried(
    call: Callable[[int], T],
    errors: tuple[type[BaseException], ...],
    on_retry: Callable[[BaseException, float, int], None],
    *,
    final: Callable[[BaseException], bool] = lambda exc: False,
) -> T:
    """``call(attempt)`` (1, 2, ...), called again after each of ``errors`` for up to ``RETRY_S``, with the
    ``waits`` between: ``on_retry(error, wait, attempt)`` before each wait. The last error is raised, and
    at once an error that is ``final``."""
    deadline, delays, attempt = time.monotonic() + RETRY_S, waits(), 0
    while True:
        attempt += 1
        try:
            return call(attempt)
        except errors as exc:
            delay = next(delays)
            if final(exc) or time.monotonic() + delay > deadline:
                raise
            on_retry(exc, delay, attempt)
            time.sleep(delay)
