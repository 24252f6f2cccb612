"""The estimators' argument checks: ``units.check_int`` and ``check_number`` raising ``EstimateError``.

Owns only the translation of the one validation helper's ValueError into the estimators' error type (itself
a ValueError); knows nothing of any estimator.
"""

from __future__ import annotations

from typing import Any

from .. import units
from ..exceptions import EstimateError

__all__ = ["check_int", "check_number"]


def check_int(value: object, name: str, *, message: str | None = None, **bounds: Any) -> int:
    """``units.check_int(value, name, **bounds)``, raising ``EstimateError``.

    ``message`` replaces the helper's own when the int is one part of a larger argument (a shape, a dict).

    Example:
        >>> check_int(0, "batch_size", minimum=1)
        Traceback (most recent call last):
        ...
        optuna_memprune.exceptions.EstimateError: batch_size must be a positive int, but got 0.
    """
    try:
        return units.check_int(value, name, **bounds)  # type: ignore[return-value]
    except ValueError as e:
        raise EstimateError(message or str(e)) from None


def check_number(value: object, name: str, *, message: str | None = None, **bounds: Any) -> float:
    """``units.check_number(value, name, **bounds)``, raising ``EstimateError`` (``message`` as above)."""
    try:
        return units.check_number(value, name, **bounds)  # type: ignore[return-value]
    except ValueError as e:
        raise EstimateError(message or str(e)) from None
