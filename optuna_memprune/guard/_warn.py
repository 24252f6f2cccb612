"""Warnings the guard gives its user: pointed at the user's own line, and each given once per guard.

Owns the stack walk past Optuna's and this package's frames; knows nothing of trials or budgets.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

_logger = logging.getLogger("optuna_memprune.guard")

_OURS = ("optuna", "optuna_memprune")  # top-level packages whose frames a warning skips

#: Consecutive trials failing the same way before a footprint failure is said on stderr.
FAILURES_BEFORE_WARNING = 3


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside Optuna and this package."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OURS:
        frame, level = frame.f_back, level + 1
    return level


class OnceWarnings:
    """The misuse warnings of one guard: each key is warned (and logged) once, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given: set[str] = set()
        self._streak: tuple[str | None, int] = (None, 0)  # the last failure's kind, and how many in a row

    def once(self, key: str, message: str) -> None:
        """Warn (pointing at the user's line) and log ``message``, unless ``key`` was warned before."""
        with self._lock:
            if key in self._given:
                return
            self._given.add(key)
        _logger.warning(message)
        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())

    def failure(self, kind: str | None, message: str = "") -> None:
        """Count one trial's footprint failure of ``kind`` (``None``: the footprint worked, which ends the
        streak); once ``FAILURES_BEFORE_WARNING`` trials in a row failed with the same kind, warn
        ``message`` (once per kind)."""
        with self._lock:
            last, count = self._streak
            count = count + 1 if kind is not None and kind == last else 1
            self._streak = (kind, count)
        if kind is not None and count >= FAILURES_BEFORE_WARNING:
            self.once(f"footprint-failed:{kind}", message)
