"""The estimators' argument checks: ``units.check_int`` and ``check_number`` raising ``EstimateError``, and the
one table of ceilings (the largest value of each kind an estimator takes).

Owns only the translation of the one validation helper's ValueError into the estimators' error type (itself
a ValueError) and the ceilings; knows nothing of any estimator.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, overload

from .. import units
from ..exceptions import EstimateError

__all__ = ["CEILINGS", "Ceiling", "check_count", "check_int", "check_number", "check_total"]


class Ceiling(NamedTuple):
    """The largest value of one kind an estimator takes (``shown`` as messages write it), and why no real run
    goes past it."""

    value: int
    shown: str
    reason: str


#: The largest value of each kind, far beyond any real machine: a typo (``buffer_size=1e99``) is an error that
#: says so instead of a 91-digit total. The one table; estimators name a kind, never a number.
CEILINGS: dict[str, Ceiling] = {
    # Bytes of a footprint's total (the largest single machines hold tens of TiB).
    "bytes": Ceiling(2**50, "1 PiB", "more memory than any real machine has"),
    # Things held in memory at once, each of a byte or more (buffer transitions, rollout steps, timesteps).
    "items": Ceiling(
        2**50, "2**50", "more items of a byte or more would fill over 1 PiB, more memory than any real machine has"
    ),
    # One dimension of a traced tensor (batch, layer width, features, quantiles, stacked frames).
    "dimension": Ceiling(
        2**24, "2**24", "a tensor with two such dimensions would hold over 2**48 elements, over 1 PiB in float32"
    ),
    # Processes, threads and env copies.
    "processes": Ceiling(2**22, "2**22", "Linux runs no more processes or threads than its PID_MAX_LIMIT"),
}


def _shown(value: object) -> str:
    """A value as a message shows it: a huge int in exponent form (not 100 digits)."""
    if units.is_int(value) and abs(value) >= 10**15:
        return f"{float(value):.3g}"
    return repr(value)


def check_int(
    value: object, name: str, *, message: str | None = None, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``units.check_int(value, name, minimum=minimum, maximum=maximum)``, raising ``EstimateError``.

    ``message`` replaces the helper's own when the int is one part of a larger argument (a shape, a dict).

    Examples:
        >>> check_int(0, "batch_size", minimum=1)
        Traceback (most recent call last):
        ...
        optuna_memprune.exceptions.EstimateError: batch_size must be a positive int, but got 0.
    """
    try:
        return units.check_int(value, name, minimum=minimum, maximum=maximum)
    except ValueError as e:
        raise EstimateError(message or str(e)) from None


def check_number(
    value: object,
    name: str,
    *,
    message: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    open_min: bool = False,
    open_max: bool = False,
) -> float:
    """``units.check_number(value, name, ...)`` with these bounds, raising ``EstimateError`` (``message`` as
    above)."""
    try:
        return units.check_number(value, name, minimum=minimum, maximum=maximum, open_min=open_min, open_max=open_max)
    except ValueError as e:
        raise EstimateError(message or str(e)) from None


@overload
def check_count(value: object, name: str, kind: str, *, minimum: int = ..., optional: Literal[False] = ...) -> int: ...


@overload
def check_count(value: object, name: str, kind: str, *, minimum: int = ..., optional: bool) -> int | None: ...


def check_count(value: object, name: str, kind: str, *, minimum: int = 1, optional: bool = False) -> int | None:
    """An int in ``[minimum, CEILINGS[kind].value]``, else ``EstimateError`` naming ``name``, the range and,
    above the ceiling, its reason. An integral float (``1e5``, how sizes are written) counts as an int.

    Examples:
        >>> check_count(100_000, "buffer_size", "items")
        100000
        >>> check_count(10**99, "buffer_size", "items")
        Traceback (most recent call last):
        ...
        optuna_memprune.exceptions.EstimateError: buffer_size must be an int in [1, 2**50], but got 1e+99:
        more items of a byte or more would fill over 1 PiB, more memory than any real machine has.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ceiling = CEILINGS[kind]
    if units.is_int(value) and value > ceiling.value:
        raise EstimateError(
            f"{name} must be an int in [{minimum}, {ceiling.shown}], but got {_shown(value)}: {ceiling.reason}."
        )
    try:
        return units.check_int(value, name, minimum=minimum, optional=optional)
    except ValueError as e:
        raise EstimateError(str(e)) from None


def check_total(nbytes: int, what: str, hint: str) -> int:
    """``nbytes`` if it is at most the ``"bytes"`` ceiling, else ``EstimateError`` saying that ``what`` (the
    predicted RAM of ...) is beyond any real machine, and which inputs to check (``hint``)."""
    ceiling = CEILINGS["bytes"]
    if nbytes > ceiling.value:
        raise EstimateError(
            f"{what} is {units.format_bytes(nbytes)}, over {ceiling.shown}, {ceiling.reason}: check {hint}."
        )
    return nbytes
