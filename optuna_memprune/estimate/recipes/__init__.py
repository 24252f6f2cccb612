"""Ready footprints for popular training stacks: ``recipes.sb3(algo, env_id, params, ...)``.

Each recipe turns a library's own params into a Footprint with the estimators; it knows nothing of Optuna.
"""

from __future__ import annotations

from .sb3 import ALGOS as SB3_ALGOS
from .sb3 import sb3

__all__ = ["sb3", "SB3_ALGOS"]
