"""The rule of the calibration recheck: when a cached stack baseline is rechecked, its tolerance, and what one
fresh probe of it means (kept, drifted, or read while this host is short of memory).

Owns the switch (``MEMPRUNE_RECHECK``), the tolerance, the wording of the recheck's log lines and the host's
memory conditions recorded with a measurement; knows nothing of the cache file, of probes or of recipes.

What drifts, measured on a 2-core, 24 GiB host (torch, optuna and sqlalchemy imported, one training step):
the probe's peak RSS varied by at most 4.4 MiB over 20 runs with a warm, a cold (``drop_caches``) and a
freshly written page cache, and under full CPU load; with the process short of memory (a cgroup limit
below its needs) the kernel took back its file-backed library pages and the peak read 11 to 57 MiB (3 to
18%) lower. The tolerance, ``max(3%, 8 MiB)`` (10 MiB for that stack), is twice that noise; a thread
count may differ by one (as the process estimator's own accuracy test allows).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, NamedTuple, TypeGuard

from .. import procfs
from ..units import format_bytes

#: The environment variable that turns the recheck off (``0``, ``off``, ``false``, ``no``) or on (the default).
ENV_VAR = "MEMPRUNE_RECHECK"
#: A fresh baseline further than this from the cached one (relative, and at least ``TOLERANCE_BYTES``) drifted.
TOLERANCE_FRACTION = 0.03
TOLERANCE_BYTES = 8 << 20
#: An entry measured or rechecked this recently (seconds) is not rechecked: processes started together (a
#: runner's workers, several studies on one host) share one recheck.
RECENT_S = 600.0
_OFF, _ON = ("0", "off", "false", "no"), ("1", "on", "true", "yes", "")


class Verdict(NamedTuple):
    """What a recheck found: ``kind`` is ``"kept"`` (within tolerance), ``"drifted"`` (recalibrate) or
    ``"pressure"`` (lower now because the kernel took back file-backed pages: the cached figure stays);
    ``message`` is its one log line (a drift's without its end: what was recalibrated)."""

    kind: str
    message: str


def enabled() -> bool:
    """Whether the recheck runs: ``MEMPRUNE_RECHECK`` unset or on (``1``, ``on``, ``true``, ``yes``), not
    when off (``0``, ``off``, ``false``, ``no``); ValueError naming it for another value."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _OFF or value in _ON:
        return value not in _OFF
    raise ValueError(f"{ENV_VAR} must be 1 or 0 (on or off), but got {os.environ[ENV_VAR]!r}.")


def tolerance(ram: int) -> int:
    """The largest difference (bytes) from a cached baseline of ``ram`` bytes that is not a drift.

    >>> format_bytes(tolerance(334 << 20)), format_bytes(tolerance(30 << 20))
    ('10.02 MiB', '8.00 MiB')
    """
    return max(TOLERANCE_BYTES, int(TOLERANCE_FRACTION * ram))


def host() -> dict[str, int]:
    """This host's memory conditions now, in bytes: ``MemAvailable`` and ``Cached`` (the page cache) of
    ``/proc/meminfo``; ``{}`` where it cannot be read."""
    try:
        data = procfs.read("/proc/meminfo")
    except OSError:
        return {}
    return {name: procfs.field(data, f"\n{name}:".encode()) * procfs.KiB for name in ("MemAvailable", "Cached")}


def recent(raw: dict[str, Any], now: float) -> bool:
    """Whether an entry was measured or rechecked within ``RECENT_S`` of ``now`` (wall clock; a time in the
    future, a clock set back or a hand edit, does not count)."""
    times = [raw.get("measured_at"), (raw.get("checked") or {}).get("at")]
    return any(_number(t) and now - RECENT_S <= t <= now + 60 for t in times)


def compare(label: str, cached: dict[str, Any], fresh: dict[str, Any], measured_at: Any, now: float) -> Verdict:
    """The verdict on ``fresh``, the stack probe's result at one torch thread, against ``cached``, the cached
    entry's result at one torch thread (each with ``warm`` VmHWM, Threads and, from this version on, RssFile).

    A fresh figure lower by more than the tolerance, of which at least half is file-backed pages missing from
    its RSS, was read while the kernel reclaims page cache: recalibrating then would cache a baseline that
    later trials exceed, so the cached one stays.

    >>> point = lambda mib, file_mib: {"warm": {"VmHWM": mib << 20, "RssFile": file_mib << 20, "Threads": 2}}
    >>> compare("torch", point(334, 100), point(336, 101), None, 0).kind
    'kept'
    >>> compare("torch", point(334, 100), point(434, 101), None, 0).message[:62]
    'The calibrated baseline of torch drifted: 434.00 MiB now, 334.'
    >>> compare("torch", point(334, 100), point(312, 80), None, 0).kind
    'pressure'
    >>> compare("torch", point(334, 100), point(312, 99), None, 0).kind
    'drifted'
    """
    old, new = cached["warm"]["VmHWM"], fresh["warm"]["VmHWM"]
    tol, diff = tolerance(old), new - old
    when = f"measured {_age(now - measured_at)} ago" if _number(measured_at) else "measured by an older version"
    figures = (
        f"{format_bytes(new)} now, {format_bytes(old)} {when} ({'+' if diff >= 0 else '-'}"
        f"{format_bytes(abs(diff))}, {diff / old:+.0%}; tolerance {format_bytes(tol)})"
    )
    threads_old, threads_new = cached["warm"].get("Threads", 0), fresh["warm"].get("Threads", 0)
    threads = abs(threads_old - threads_new) > 1 or cached.get("default_torch_threads") != fresh.get(
        "default_torch_threads"
    )
    if abs(diff) <= tol and not threads:
        return Verdict("kept", f"The calibrated baseline of {label} holds: {figures}.")
    file_old, file_new = cached["warm"].get("RssFile"), fresh["warm"].get("RssFile")
    if diff < -tol and not threads and _number(file_old) and _number(file_new) and file_old - file_new >= -diff / 2:
        return Verdict(
            "pressure",
            (
                f"The calibrated baseline of {label} reads lower while this host is short of memory: {figures}; "
                f"its file-backed pages {format_bytes(file_new)} against {format_bytes(file_old)}: "
                "the cached figure is kept."
            ),
        )
    if threads:
        figures += f"; threads {threads_new} against {threads_old} at one torch thread"
    return Verdict("drifted", f"The calibrated baseline of {label} drifted: {figures}")


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _age(seconds: float) -> str:
    """``seconds`` in words: ``42 s``, ``12 min``, ``3.5 h``, ``2.0 days``.

    >>> _age(42), _age(720), _age(12600), _age(172800)
    ('42 s', '12 min', '3.5 h', '2.0 days')
    """
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def stamp(t: Any) -> str:
    """A wall-clock time (seconds since the epoch) as ``2026-11-22 15:17 UTC``; ``-`` when there is none.

    >>> stamp(0), stamp(None)
    ('1970-01-01 00:00 UTC', '-')
    """
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if _number(t) else "-"
