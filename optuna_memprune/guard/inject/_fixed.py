"""``memprune run --clamp-fixed``'s note on every trial: the program's sampler, wrapped so that each trial
records the fixed hyperparameters lowered for it as it starts.

Owns that wrapper only (what to lower is the recipe's, where to set it the hook's); knows nothing of budgets.
"""

from __future__ import annotations

from typing import Any

from optuna.samplers import BaseSampler

from ... import _internals, records


class Overriding(BaseSampler):
    """The program's sampler, writing ``--clamp-fixed``'s overrides on every trial as it starts (rejected
    trials too: their prediction used them); everything else is the program's sampler's."""

    def __init__(self, base: Any, fixed: dict[str, tuple[Any, int]]) -> None:
        self.base, self.fixed = base, dict(fixed)

    def __str__(self) -> str:
        return str(self.base)

    def before_trial(self, study: Any, trial: Any) -> None:
        self.base.before_trial(study, trial)
        try:
            records.write_overrides(study, _internals.trial_id(trial), self.fixed)
        except Exception:  # noqa: BLE001 - never leave a trial RUNNING over its note
            pass

    def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self.base.sample_independent(study, trial, name, distribution)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
