"""Interrupting an in-process trial's thread: an exception raised in it at its next Python bytecode
(CPython's ``PyThreadState_SetAsyncExc``), and whether that thread is importing a module now, when the
exception would leave a package half-imported for every later trial of the process.

Owns these two thread-level reads and writes; knows nothing of budgets, trials or Optuna.
"""

from __future__ import annotations

import ctypes
import sys


def importing(thread_id: int) -> bool:
    """Whether the thread runs an import now: a frame of importlib's bootstrap is on its stack.

    Examples:
        >>> import threading
        >>> importing(threading.get_ident())
        False
    """
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread at its next bytecode; ``None`` clears one not yet raised."""
    # CPython C API; None is passed as NULL, which clears a pending exception of that thread.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc)
    )
