"""The audited module: every read of Optuna's and multiprocessing's private names in the package.

Owns the workarounds for what their public APIs do not offer, each with the reason it is needed; knows
nothing of footprints, budgets or records. tests/test_layers.py allows private names here and nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial


def storage_of(study: "optuna.Study") -> "BaseStorage":
    """The study's storage: writes on a trial known only as a FrozenTrial go through it (Optuna has no public
    handle; ``Study._storage``, optuna/study/study.py)."""
    return study._storage


def trial_id(trial: "optuna.Trial | FrozenTrial | Any") -> int:
    """The storage's id of a trial (``Trial._trial_id`` / ``FrozenTrial._trial_id``): the key every storage
    method takes, which the public API does not expose."""
    return trial._trial_id
