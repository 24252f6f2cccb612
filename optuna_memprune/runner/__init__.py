"""The process-per-trial runner: ``optimize()`` runs each trial in its own process under the guard.

``_optimize`` (the call), ``_loop`` (the parent's loop), ``_watchdog`` (one trial's process seen from the
parent), ``_reserve`` (what a trial reserves), ``_owners`` (the ledger key of a runner's trial, ending the
trials of dead runners, a trial's runner for the report), ``_storage`` (retried storage calls, the
storage's fingerprint), ``_child`` (the only code that runs in a trial's process), ``_forkserver`` and
``_progress``; ``_ray``, ``_ray_nodes`` and ``_ray_task`` (the Ray backend) and ``_tune`` (Ray Tune trials
placed by prediction).
"""

from __future__ import annotations

from ._optimize import optimize
from ._owners import RunnerState, runner_states
from ._reserve import check_budget_fits
from ._tune import OverBudget, tune_with_resources

__all__ = ["optimize", "tune_with_resources", "OverBudget", "check_budget_fits", "runner_states", "RunnerState"]
