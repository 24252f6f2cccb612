"""What one guard holds, and the package's only way to it: ``Guard``, the base of ``MemoryGuard``.

A guard holds its ``Policy`` (the footprint, budget and choices, and the
rules the wrappers apply with them), its trials in this process, the misuse warnings it gave and the forecast
stop's ``horizon``. None of these is the user's: the wrappers, the runner and ``memprune run`` reach them
through ``policy_of``, ``trials_of`` and ``warnings_of`` (the runner and ``memprune run`` from
``guard.backend``). They live here rather than in ``_guard.py`` because ``_guard.py`` imports the wrappers
that use them.

Owns what one guard holds and what of it pickles; knows nothing of the user's arguments or of Optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._trials import TrialRegistry
from ._warn import OnceWarnings

if TYPE_CHECKING:
    from ._policy import Policy


class Guard:
    """What one guard holds: its policy, its trials in this process, its warnings, the forecast's horizon.

    The base of ``MemoryGuard``, which checks the user's arguments and builds the
    policy. Pickles its configuration (the policy and the horizon) only: running trials and given warnings
    stay in their process, and an unpickled guard starts with none.
    """

    def __init__(self, policy: Policy, horizon: Any) -> None:
        self._policy = policy
        self._horizon = horizon
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._trials = TrialRegistry()
        self._warnings = OnceWarnings()

    def __getstate__(self) -> dict[str, Any]:
        # Running trials and given warnings stay in their process; the configuration travels.
        return {"_policy": self._policy, "_horizon": self._horizon}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()


def policy_of(guard: Guard) -> Policy:
    """The guard's footprint, budget and choices, and the rules the wrappers apply with them."""
    return guard._policy


def trials_of(guard: Guard) -> TrialRegistry:
    """The guard's trials in this process."""
    return guard._trials


def warnings_of(guard: Guard) -> OnceWarnings:
    """The misuse warnings the guard gave (each once)."""
    return guard._warnings


def check_guard(guard: object) -> None:
    """TypeError unless ``guard`` is a MemoryGuard: the wrappers' argument check, made without importing the
    guard that imports them."""
    if not isinstance(guard, Guard):
        raise TypeError(f"guard must be a MemoryGuard, but got {type(guard).__name__}.")
