"""How the runner itself ends: SIGTERM made to end a run like Ctrl-C (the trials' process trees stopped and
their trials ended, then exit status 143), and the words for the trials an abnormal end fails.

Runs in the runner's process; knows nothing of trials beyond those words.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class RunnerTerminated(SystemExit):
    """SIGTERM reached the runner (``kill PID``, a scheduler ending the job): it ends like Ctrl-C, with the
    trials' process trees stopped and their trials ended, then the process exits with status 143."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def why_ended(exc: BaseException) -> str:
    """How the runner ended abnormally, for the reason of the trials it ended."""
    if isinstance(exc, RunnerTerminated):
        return "the runner was terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return "the runner was interrupted (Ctrl-C)"
    return f"the runner failed ({type(exc).__name__}: {exc})"


def end_like_ctrl_c() -> Any:
    """Make SIGTERM end the run like Ctrl-C (only where it would kill the process outright: the main
    thread and no handler of the caller's); returns the handler to put back, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None

    def terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise RunnerTerminated()

    signal.signal(signal.SIGTERM, terminated)
    return previous
