"""Human text for report figures: sizes, thread counts, params, relative errors, one trial's summary.

Shared by the table, the HTML and the dashboard notes so they say the same thing; knows no renderer.
"""

from __future__ import annotations

from typing import Any

from ..records import Decision
from ..units import format_bytes
from ._data import GuardedTrial, Quality

LABELS = {"ram": "RAM", "vram": "VRAM", "threads": "threads"}


def figure(resource: str, value: int | None) -> str:
    """``figure("ram", 2**30) == "1.00 GiB"``; threads as a count; ``-`` when unknown."""
    if value is None:
        return "-"
    return str(value) if resource == "threads" else format_bytes(value)


def value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def params(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={value(v)}" for k, v in p.items())


def clamped(c: dict[str, Any], ran: dict[str, Any]) -> str:
    """``buffer_size 363960 -> 111980``: what the guard lowered, from the sampled to the run value."""
    return ", ".join(f"{k} {value(v)} -> {value(ran.get(k, '?'))}" for k, v in c.items())


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def resources(t: GuardedTrial) -> list[str]:
    """The resources worth showing for a trial: budgeted ones, and any with a prediction or a peak."""
    return [r for r in LABELS if t.figure("budget", r) is not None or t.figure("pred", r) or t.figure("peak", r)]


def quality_line(q: Quality) -> str:
    if q.n == 0:
        return f"{LABELS[q.resource]}: no trial ran to the end with both a prediction and a peak"
    return (
        f"{LABELS[q.resource]}: median {pct(q.median_rel_error)}, worst {pct(q.worst_rel_error)} "
        f"(#{q.worst_trial}), under-predicted {q.under_predicted}/{q.n}"
    )


def reason(t: GuardedTrial) -> str:
    """The record's reason; for a trial clamped before launch and then pruned or stopped, what was lowered
    (a clamped trial's own reason says it already)."""
    r = t.record
    if r.clamped_from and r.decision is not Decision.CLAMPED:
        return f"{r.reason} (clamped before launch: {clamped(r.clamped_from, t.params)})"
    return r.reason
