"""Byte sizes ("6GiB", "512MB", "1.5 GB", ints) and the checks every public argument goes through.

Owns parsing and formatting of human sizes and the one int/number validation; knows nothing of Optuna,
torch or the OS.
"""

from __future__ import annotations

import math
import re
from typing import Literal, TypeGuard, overload

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
    "eib": 1024**6,
    "bytes": 1,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GiB = 1024**3
MiB = 1024**2


def parse_bytes(value: int | float | str, *, name: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Accepts ints, integral floats (``1e9``) and strings such as ``"6GiB"``, ``"512MB"``, ``"1.5 GB"`` or
    ``"1024"``. Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and
    PiB, EiB as numpy and torch print them) powers of 1024. Raises ``ValueError`` naming ``name`` and the
    text given when the value is not a size or is negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a byte size such as '6GiB' or an int, but got {value!r}.")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            raise ValueError(f"{name} must be a whole number of bytes, but got {value!r}.")
        number = int(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"{name} must be a byte size such as '6GiB', '512MB' or '1.5 GB', but got {value!r}.")
        number = int(round(float(match.group(1)) * _UNITS[unit]))
    else:
        raise ValueError(f"{name} must be a byte size such as '6GiB' or an int, but got {value!r}.")
    if number < 0:
        raise ValueError(f"{name} cannot be negative, but got {value!r}.")
    return number


def format_bytes(n: int | float) -> str:
    """Human form of a byte count in binary units: ``format_bytes(6 * 2**30) == '6.00 GiB'``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


def _expected(kind: str, minimum: float | None, maximum: float | None, open_min: bool, open_max: bool) -> str:
    article = "an" if kind == "int" else "a"
    if minimum is not None and maximum is not None:
        lo, hi = ("(" if open_min else "["), (")" if open_max else "]")
        return f"{article} {kind} in {lo}{minimum}, {maximum}{hi}"
    if minimum is not None:
        if minimum == 0 and not open_min:
            return f"a non-negative {kind}"
        if (minimum == 1 and kind == "int" and not open_min) or (minimum == 0 and open_min):
            return f"a positive {kind}"
        return f"{article} {kind} {'>' if open_min else '>='} {minimum}"
    if maximum is not None:
        return f"{article} {kind} {'<' if open_max else '<='} {maximum}"
    return f"{article} {kind}"


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


@overload
def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = ...,
    maximum: int | None = ...,
    optional: Literal[False] = ...,
    expected: str | None = ...,
) -> int: ...


@overload
def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = ...,
    maximum: int | None = ...,
    optional: bool,
    expected: str | None = ...,
) -> int | None: ...


def check_int(
    value: object,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    optional: bool = False,
    expected: str | None = None,
) -> int | None:
    """Return ``value`` if it is an int (not a bool) within ``[minimum, maximum]``, else raise ``ValueError``.

    The one check of counts across the package; the message names ``name``, what was expected and what was
    given (``expected`` replaces the description of the range). ``optional=True`` lets ``None`` through.

    Examples:
        >>> check_int(4, "n_workers", minimum=1)
        4
        >>> check_int(0, "n_workers", minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: n_workers must be a positive int, but got 0.
    """
    if value is None and optional:
        return None
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        expected = expected or _expected("int", minimum, maximum, False, False)
        raise ValueError(f"{name} must be {expected}{' or None' if optional else ''}, but got {value!r}.")
    return value


@overload
def check_number(
    value: object,
    name: str,
    *,
    minimum: float | None = ...,
    maximum: float | None = ...,
    open_min: bool = ...,
    open_max: bool = ...,
    optional: Literal[False] = ...,
    expected: str | None = ...,
) -> float: ...


@overload
def check_number(
    value: object,
    name: str,
    *,
    minimum: float | None = ...,
    maximum: float | None = ...,
    open_min: bool = ...,
    open_max: bool = ...,
    optional: bool,
    expected: str | None = ...,
) -> float | None: ...


def check_number(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    open_min: bool = False,
    open_max: bool = False,
    optional: bool = False,
    expected: str | None = None,
) -> float | None:
    """Return ``value`` if it is a finite real number (int or float, not a bool) within the given bounds.

    ``open_min``/``open_max`` exclude the bound itself. Raises ``ValueError`` naming ``name``, the range (or
    ``expected``) and the value given; ``optional=True`` lets ``None`` through.

    Examples:
        >>> check_number(0.9, "soft", minimum=0, maximum=1, open_min=True)
        0.9
        >>> check_number(float("nan"), "interval", minimum=0, open_min=True)
        Traceback (most recent call last):
        ...
        ValueError: interval must be a positive number, but got nan.
    """
    if value is None and optional:
        return None
    if not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value):
        ok = minimum is None or (value > minimum if open_min else value >= minimum)
        if ok and (maximum is None or (value < maximum if open_max else value <= maximum)):
            return value
    expected = expected or _expected("number", minimum, maximum, open_min, open_max)
    raise ValueError(f"{name} must be {expected}{' or None' if optional else ''}, but got {value!r}.")


#: The largest byte size any argument may hold: 1 EiB (2**60 bytes). The largest single machines hold tens
#: of TiB; a size beyond this is a typo or a unit mix-up, never a machine.
MAX_BYTES = 2**60


def check_bytes(
    value: int | float | str, name: str, *, minimum: int = 0, why_minimum: str = "", maximum: int = MAX_BYTES
) -> int:
    """``parse_bytes(value)`` within ``[minimum, maximum]``, else ``ValueError`` naming ``name``, the bound,
    ``why_minimum`` (the reason for the floor, in words) and the value given.

    Examples:
        >>> check_bytes("64MiB", "Budget.ram", minimum=32 * MiB)
        67108864
        >>> check_bytes("1e30TiB", "Budget.ram")
        Traceback (most recent call last):
        ...
        ValueError: Budget.ram must be at most 1 EiB (2**60 bytes: no machine has more memory), but got '1e30TiB'.
    """
    try:
        number = parse_bytes(value, name=name)
    except OverflowError:  # "1e400" is an infinite float
        number = MAX_BYTES + 1
    given = repr(value) if is_int(value) else f"{value!r} ({_round_size(number)})"
    if number > maximum:
        limit = "1 EiB (2**60 bytes: no machine has more memory)" if maximum == MAX_BYTES else format_bytes(maximum)
        raise ValueError(f"{name} must be at most {limit}, but got {value!r}.")
    if number < minimum:
        why = f" ({why_minimum})" if why_minimum else ""
        raise ValueError(f"{name} must be at least {_round_size(minimum)}{why}, but got {given}.")
    return number


def _round_size(n: int) -> str:
    """``32 MiB`` rather than ``32.00 MiB`` for the round sizes a floor is stated in."""
    text = format_bytes(n)
    return text.replace(".00 ", " ")
