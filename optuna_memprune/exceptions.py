"""Error types of optuna-memprune; every one pickles, since they cross process boundaries.

Knows nothing of Optuna, torch or the OS: only the names and payloads of the errors.
"""

from __future__ import annotations


class MemPruneError(Exception):
    """Base class of every error raised by optuna-memprune."""


class EstimateError(MemPruneError, ValueError):
    """A footprint could not be estimated from the given params (bad or missing param, unknown layout)."""


class CalibrationError(MemPruneError, RuntimeError):
    """Measuring this host's baseline failed (a calibration subprocess crashed or timed out)."""


class EnforcementError(MemPruneError, RuntimeError):
    """``enforce="cgroup"`` where no cgroup can be made for the trials (the reason is in the message)."""
