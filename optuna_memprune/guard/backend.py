"""What a backend that runs trials outside the caller's thread takes from the guard.

The process-per-trial runner (``optuna_memprune.runner``) and ``memprune run``'s split of ``n_jobs``
(``optuna_memprune.run``) sit above the guard and use only the names here: what a guard holds (its policy,
trials and warnings, read through ``policy_of``, ``trials_of`` and ``warnings_of``: they are not the
user's), one running trial's state, how a trial ended and what counts as running out of memory, the
forecast stop, the learned margin of a reservation and this process's memory readings. Nothing here is
new; each name is owned by the guard's private module it comes from.
"""

from __future__ import annotations

from ._call import MonitorOnly
from ._core import Guard, policy_of, trials_of, warnings_of
from ._forecast_stop import StepForecast, trial_forecast
from ._margin import margin as learned_margin
from ._objective import store_rejection
from ._oom import OutOfMemory, killed_by_oom_killer, out_of_memory
from ._outcome import trial_outcome
from ._peak_rss import peak_rss
from ._policy import Policy
from ._start import rss
from ._trials import TrialGuardState

__all__ = [
    "Guard",
    "policy_of",
    "trials_of",
    "warnings_of",
    "Policy",
    "TrialGuardState",
    "MonitorOnly",
    "StepForecast",
    "trial_forecast",
    "store_rejection",
    "OutOfMemory",
    "out_of_memory",
    "killed_by_oom_killer",
    "trial_outcome",
    "learned_margin",
    "peak_rss",
    "rss",
]
