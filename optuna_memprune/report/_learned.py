"""The learned footprint in the report: its own rows (per trial: phase, trials learned from, the bound the
guard used, the fit, the peak), its own quality lines, and a plot of predicted vs observed per trial number
so a person sees the learner converge.

Reads ``ReportData`` (each record's ``learned`` field) only; knows nothing of how the model was fitted.
Each renderer is one function per format, called by ``_table``, ``_html`` and ``_data``'s JSON.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import Decision
from . import _format as fmt

if TYPE_CHECKING:
    from ._data import GuardedTrial, ReportData
    from ._stops import TerminalTable

MiB = 2**20


@dataclass(frozen=True)
class LearnedRow:
    """One trial's learned prediction of RAM: ``bound`` (what the guard used), ``center`` (the fit),
    ``raw`` (a footprint function's own figure, corrected mode), ``peak`` (a learned trial's own increment
    over its start where it shared its process), ``level`` (the process's peak: what a relative error is
    of, as admission compared usage plus increment with it); ``None`` where unknown."""

    number: int
    state: str
    decision: str
    mode: str
    phase: str
    n: int
    bound: int | None
    center: int | None
    raw: int | None
    peak: int | None
    level: int | None = None

    def error(self, kind: str = "bound") -> float | None:
        """``(peak - figure) / the process's peak`` for ``kind`` ``bound``, ``center`` or ``raw``: + is
        under-predicted. Of the process's peak, not the increment: a trial adding 1 MiB made any bound
        hundreds of percent over."""
        figure: int | None = getattr(self, kind)
        if not self.peak or figure is None:
            return None
        return (self.peak - figure) / (self.level or self.peak)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "decision": self.decision,
            "mode": self.mode,
            "phase": self.phase,
            "n": self.n,
            "bound_ram": self.bound,
            "center_ram": self.center,
            "raw_ram": self.raw,
            "peak_ram": self.peak,
        }


def rows(data: ReportData) -> list[LearnedRow]:
    """The trials whose record carries a learned prediction, in number order."""
    return [_row(t) for t in data.trials if t.record.learned]


def _row(t: GuardedTrial) -> LearnedRow:
    learned = t.record.learned
    peak = level = None if t.decision is Decision.OUT_OF_MEMORY else t.record.peak_ram
    start = t.record.start_ram
    if peak is not None and start is not None and t.increment:
        # in a shared process the fit is of the trial's own increment (a first trial's one-time costs apart)
        peak -= start + t.record.kept.get("ram", 0)
    bound = (learned.get("bound") or {}).get("ram", t.record.pred_ram)
    return LearnedRow(
        t.number,
        t.state,
        t.decision.value,
        str(learned.get("mode", "")),
        str(learned.get("phase", "")),
        int(learned.get("n", 0)),
        bound,
        (learned.get("center") or {}).get("ram"),
        (learned.get("raw") or {}).get("ram"),
        peak,
        level,
    )


def quality(data: ReportData) -> dict[str, Any] | None:
    """Median ``LearnedRow.error`` over the trials that ran to the end after the warm-up, for the bound,
    the fit and (corrected mode) the footprint function's own figure; ``None`` without learned trials."""
    learned = rows(data)
    if not learned:
        return None
    done = [r for r in learned if r.state == "COMPLETE" and r.phase == "bound" and r.peak]

    def median(kind: str) -> float | None:
        errors = [e for r in done if (e := r.error(kind)) is not None]
        return statistics.median(errors) if errors else None

    return {
        "mode": learned[-1].mode,
        "warmup_trials": sum(r.phase == "warm-up" for r in learned),
        "n": len(done),
        "median_rel_error_bound": median("bound"),
        "median_rel_error_center": median("center"),
        "median_rel_error_raw": median("raw"),
    }


def json_dict(data: ReportData) -> dict[str, Any] | None:
    """``{"rows": [...], "mode", "warmup_trials", "n", "median_rel_error_*"}``; ``None`` without learned trials."""
    learned = rows(data)
    if not learned:
        return None
    q = quality(data) or {}
    return {
        "rows": [r.to_json_dict() for r in learned],
        **{k: (None if isinstance(v, float) and v != v else v) for k, v in q.items()},
    }


def lines(data: ReportData) -> list[str]:
    """The learned footprint's quality in words (empty without learned trials)."""
    q = quality(data)
    if q is None:
        return []
    parts = [f"bound {fmt.pct(q['median_rel_error_bound'])}", f"fit {fmt.pct(q['median_rel_error_center'])}"]
    if q["median_rel_error_raw"] is not None:
        parts.append(f"footprint function alone {fmt.pct(q['median_rel_error_raw'])}")
    return [
        f"learned footprint ({q['mode']}): {q['warmup_trials']} trials in the warm-up; median RAM error over "
        f"the {q['n']} trials that ran to the end after it: " + ", ".join(parts)
    ]


def table(data: ReportData) -> TerminalTable | None:
    """The learned rows as a table (rich's where installed; ``None`` without learned trials)."""
    from .._console import parts

    learned = rows(data)
    if not learned:
        return None
    out: TerminalTable = parts().Table(
        title="learned predictions (RAM)", title_justify="left", box=None, pad_edge=False
    )
    for head in ("#", "state", "decision", "phase", "learned from", "bound", "fit", "function", "peak", "error"):
        out.add_column(head, justify="left" if head in ("state", "decision", "phase") else "right")
    for r in learned:
        e = r.error()
        error = "-" if e is None else fmt.pct(e)
        out.add_row(
            str(r.number),
            r.state,
            r.decision,
            r.phase,
            f"{r.n} trials",
            _mib(r.bound),
            _mib(r.center),
            _mib(r.raw),
            _mib(r.peak),
            error,
        )
    return out


def plot(data: ReportData, figure: Any, to_svg: Any) -> tuple[str | None, str]:
    """Predicted (bound and fit) and observed peak RAM per trial number (``figure``/``to_svg``: the HTML
    module's helpers)."""
    learned = [r for r in rows(data) if r.peak is not None or r.bound is not None]
    if not learned:
        return None, "No trial carries a learned prediction."
    fig = figure(9.0, 3.4)
    ax = fig.axes[0]
    peaks = [(r.number, r.peak) for r in learned if r.peak is not None]
    ax.scatter(
        [number for number, _ in peaks],
        [peak / MiB for _, peak in peaks],
        c="#495057",
        s=26,
        zorder=3,
        label="observed peak",
        gid="learned-peak",
    )
    bounded = [(r.number, r.bound) for r in learned if r.bound is not None]
    ax.scatter(
        [number for number, _ in bounded],
        [bound / MiB for _, bound in bounded],
        marker="_",
        s=140,
        c="#1c7ed6",
        linewidths=2,
        zorder=4,
        label="learned bound (admission)",
        gid="learned-bound",
    )
    fitted = [(r.number, r.center) for r in learned if r.center is not None]
    ax.scatter(
        [number for number, _ in fitted],
        [center / MiB for _, center in fitted],
        marker="x",
        s=30,
        c="#f08c00",
        zorder=4,
        label="fit",
        gid="learned-center",
    )
    warm = [r.number for r in learned if r.phase == "warm-up"]
    if warm:
        ax.axvspan(min(warm) - 0.5, max(warm) + 0.5, color="#e9ecef", zorder=0, label="warm-up")
    budget = data.budget.get("ram")
    if budget is not None:
        ax.axhline(budget / MiB, color="#e03131", ls="--", lw=1, label="budget", gid="learned-budget")
        ax.axhline(budget * data.soft / MiB, color="#f08c00", ls=":", lw=1, label="soft line", gid="learned-soft")
    ax.set(xlabel="trial number", ylabel="RAM (MiB)", title="learned prediction vs observed peak, trial by trial")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=7)
    caption = " ".join(lines(data)) or "Learned predictions per trial."
    return to_svg(fig), caption + (
        " Shaded: the warm-up (no footprint function: unchecked trials; with one: its "
        "figures x1.10 or the largest ratio seen). Stopped and pruned trials show the "
        "peak they reached."
    )


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.0f} MiB"
