"""``memprune run --clamp-fixed``'s note on every trial, and its replay: the program's sampler, wrapped so that
each trial records the fixed hyperparameters lowered for it as it starts; an rl-zoo3 command that replays such
a trial (``--trial-id``) given the same values.

Owns that wrapper and the replay's arguments (what to lower is the recipe's, where to set it the hook's);
knows nothing of budgets.
"""

from __future__ import annotations

from typing import Any

from optuna.samplers import BaseSampler

from .. import _internals, records


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


def replay(
    argv: tuple[str, ...], recipe_args: tuple[str, ...] | None, module: Any
) -> tuple[tuple[str, ...], str] | None:
    """An rl-zoo3 command that replays a trial (``--trial-id N --storage S --study-name X``) whose record says
    ``--clamp-fixed`` lowered fixed hyperparameters for it: the command with those values added to its
    ``-params`` (rl-zoo3 takes ``-params`` over the trial's stored params) and a line saying so; ``None`` for any
    other command or trial (``module``: the rl-zoo3 recipe, or None). A storage or trial that cannot be read
    is rl-zoo3's to report."""
    import argparse

    if recipe_args is None or module is None:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    for flag in ("--trial-id", "--storage", "--study-name"):
        parser.add_argument(flag)
    known = parser.parse_known_args(list(recipe_args))[0]
    if known.trial_id is None or not known.storage or not known.study_name:
        return None
    import optuna

    from ..storages import open_storage

    try:
        storage = open_storage(known.storage, existing=True)
        study = optuna.load_study(study_name=known.study_name, storage=storage)
        fixed = records.read_overrides(study.trials[int(known.trial_id)].user_attrs)
    except Exception:  # noqa: BLE001 - rl-zoo3 reads the same trial and says what is wrong with it
        return None
    if not fixed:
        return None
    extra = module.with_params(list(recipe_args), {k: v[1] for k, v in fixed.items()})[len(recipe_args) :]
    words = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in fixed.items())
    return (*argv, *extra), (
        f"trial {known.trial_id} ran with {words} (--clamp-fixed): replayed with {' '.join(extra)}"
    )
