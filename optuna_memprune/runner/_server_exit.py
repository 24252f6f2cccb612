"""Imported by the runner's fork server first among its preloads: the server then ends with ``os._exit``
once its last client has gone, after the exit handlers the libraries it preloaded registered (which run
before this one), instead of the interpreter's teardown of every module it holds: about 1 s of CPU with
torch preloaded, which ``optimize`` waits for as it stops the server. A trial's process, forked from the
server, never runs exit handlers (multiprocessing ends it with ``os._exit``).

Owns nothing else; imports only the standard library.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
