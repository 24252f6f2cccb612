"""The known search space of a study: the union of the distributions its trials suggested, which the guarded
sampler draws and checks a trial's whole assignment in. Knows nothing of footprints or budgets."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .. import _internals

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial


class KnownSpace:
    """The union of the distributions the study's trials suggested (a later trial's wins), kept
    incrementally: finished trials are folded in once, running ones are looked at on every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per (storage, study): distributions of the finished trials folded in, how many leading trials
        # (by number) are all finished and folded in, and which later finished trials are folded in too
        self._studies: dict[tuple[int, int], tuple[dict[str, BaseDistribution], list[int], set[int]]] = {}

    def __call__(
        self, study: Study, trial: FrozenTrial, declared: dict[str, BaseDistribution] | None
    ) -> dict[str, BaseDistribution]:
        # The per-trial cached list the built-in samplers read too, so this costs no extra storage query.
        trials = _internals.cached_trials(study)
        with self._lock:
            finished, prefix, folded = self._studies.setdefault(
                (id(_internals.storage_of(study)), _internals.study_id(study)), ({}, [0], set())
            )
            running = []
            for other in trials[prefix[0] :]:
                if not other.state.is_finished():
                    running.append(other)
                elif _internals.trial_id(other) not in folded:
                    folded.add(_internals.trial_id(other))
                    finished.update(other.distributions)
            while prefix[0] < len(trials) and trials[prefix[0]].state.is_finished():
                folded.discard(_internals.trial_id(trials[prefix[0]]))
                prefix[0] += 1
            space = dict(finished)
        for other in running:
            if _internals.trial_id(other) != _internals.trial_id(trial):
                space.update(other.distributions)
        if declared:
            space.update(declared)
        return space
