"""GuardedPruner: delegates to the wrapped pruner and adds the monitor's soft-line and budget breaches.

Reads the guard's per-trial state only; knows nothing of how readings are taken or trials interrupted.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from optuna.pruners import BasePruner, HyperbandPruner

from .. import _internals
from ._core import check_guard, trials_of
from ._warn import user_stacklevel

if TYPE_CHECKING:
    import optuna

    from ._core import Guard


class GuardedPruner(BasePruner):
    """A pruner that answers True once the monitor saw the trial's process cross the soft line.

    Otherwise it answers what the wrapped pruner answers (False when there is none). The soft line is
    ``soft x budget`` (default 90%); the trial's objective must be wrapped by ``guard.wrap_objective`` for
    the monitor to run, and must call ``trial.should_prune()`` as usual.

    Note:
        Optuna hands the sampler a bracket-filtered study only when ``study.pruner`` *is* a
        ``HyperbandPruner``; wrapping one silently turns that off, so it warns.

    Args:
        wrapped_pruner: the pruner to delegate to, or ``None``.
        guard: the ``MemoryGuard`` whose trials this pruner watches.

    Examples:
        >>> import optuna, optuna_memprune as omp
        >>> guard = omp.MemoryGuard(lambda p: omp.Footprint.of(ram="1GiB"), omp.Budget(ram="4GiB"))
        >>> pruner = guard.wrap_pruner(optuna.pruners.MedianPruner())
    """

    def __init__(self, wrapped_pruner: BasePruner | None, guard: Guard) -> None:
        if wrapped_pruner is not None and not isinstance(wrapped_pruner, BasePruner):
            raise TypeError(
                f"wrapped_pruner must be an optuna BasePruner instance or None, but got {wrapped_pruner!r}."
            )
        check_guard(guard)
        if isinstance(wrapped_pruner, HyperbandPruner):
            warnings.warn(
                "Wrapping a HyperbandPruner: Optuna gives the sampler Hyperband's bracket-filtered study only "
                "when study.pruner is a HyperbandPruner itself, so the sampler now sees all brackets' trials. "
                "Use another pruner, or pass the HyperbandPruner unwrapped (memory breaches then only stop "
                "trials, without the soft-line pruning).",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        self._wrapped_pruner = wrapped_pruner
        self._guard = guard

    @property
    def wrapped_pruner(self) -> BasePruner | None:
        """The pruner this one delegates to (the process-per-trial runner gives it to each trial's process)."""
        return self._wrapped_pruner

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        state = trials_of(self._guard).get(_internals.trial_id(trial))
        if state is not None and (state.soft_reading is not None or state.hard_reading is not None):
            state.soft_answered = True
            return True
        if self._wrapped_pruner is None:
            return False
        return self._wrapped_pruner.prune(study, trial)
