"""The process-per-trial runner: ``optimize()`` runs each trial in its own process under the guard.

``_optimize`` (the call), ``_loop`` (the parent's loop), ``_watchdog`` (one trial's process seen from the
parent), ``_reserve`` (what a trial reserves), ``_child`` (the only code that runs in a trial's process),
``_forkserver`` and ``_progress``.
"""

from __future__ import annotations

from ._optimize import optimize

__all__ = ["optimize"]
