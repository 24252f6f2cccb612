"""The HTML report: ReportData -> one self-contained HTML file with matplotlib plots as inline SVG.

No JavaScript, no fonts or styles from elsewhere: the file renders offline. matplotlib is imported here,
at the point of use, through its object API (``matplotlib.figure.Figure``): no pyplot, no GUI backend, no
global state changed in the caller's process.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..estimate.footprint import Footprint
from ..records import RESOURCES, Decision
from . import _format as fmt
from . import _learned, _stops
from ._table import margin_line, running_word

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

    from ._data import GuardedTrial, ReportData

MiB = 2**20
COLORS = {  # one colour per decision, the same in every plot and table
    Decision.ADMITTED: "#2b8a3e",
    Decision.CLAMPED: "#1c7ed6",
    Decision.REJECTED: "#868e96",
    Decision.SOFT_PRUNED: "#f08c00",
    Decision.STOPPED: "#e03131",
    Decision.OUT_OF_MEMORY: "#0b7285",
    Decision.UNCHECKED: "#ae3ec9",
    Decision.FORECAST_STOPPED: "#c2255c",
}
MARKERS = {"COMPLETE": "o", "PRUNED": "s", "FAIL": "X", "RUNNING": "^", "WAITING": "v"}
UNITS = {"ram": "MiB", "vram": "MiB", "threads": "threads"}
# Fixed salt for matplotlib's SVG ids: the same report gives the same file, and ids only repeat across
# the inline SVGs where their content (a clip rectangle) is identical.
_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "memprune-report",
    "font.size": 9,
    "axes.titlesize": 10,
    "font.family": "DejaVu Sans",
}  # bundled with matplotlib: text is measured with the font it names
FAR = 3.0  # a budget more than this many times the largest figure is named, not drawn


def render(data: ReportData) -> str:
    """The report as one HTML document (str). Needs matplotlib (the ``report`` extra)."""
    try:
        import matplotlib
    except ImportError as exc:
        from .._extras import MissingExtra

        raise (MissingExtra.of(exc, "the HTML report") or exc) from None
    sections = []
    plots: list[tuple[str, str, Callable[[ReportData], tuple[str | None, str]]]] = [  # id, title, draw
        ("pred-vs-peak", "Predicted vs observed peak", _pred_vs_peak),
        ("timelines", "Memory timelines", _timelines),
        ("decisions", "Decisions over trial number", _decisions),
        ("breakdown", "Footprint of the largest admitted trial", _breakdown),
    ]
    if _learned.rows(data):
        plots.append(("learned", "Learned predictions over trial number", lambda d: _learned.plot(d, _figure, _svg)))
    with matplotlib.rc_context(_RC):
        for plot_id, title, draw in plots:
            svg, caption = draw(data)
            svg = None if svg is None else _scoped(svg, plot_id)
            body = svg if svg is not None else f'<p class="empty">{_e(caption)}</p>'
            sections.append(
                f'<section class="plot" id="plot-{plot_id}"><h2>{_e(title)}</h2>{body}'
                f'<p class="caption">{_e(caption) if svg is not None else ""}</p></section>'
            )
        stops = _stops.forecast_stops(data.trials)
        drawn = _stops.plot(stops)
        if drawn is not None:
            sections.append(
                f'<section class="plot" id="plot-forecast"><h2>Forecast stops: observed and projected '
                f'RSS</h2>{_scoped(_svg(drawn[0]), "forecast")}<p class="caption">{_e(drawn[1])}</p>'
                "</section>"
            )
    return _PAGE.format(
        title=_e(f"memprune report: {data.study_name}"),
        summary=_summary(data),
        plots="\n".join(sections),
        notable=_notable(data) + _running(data) + _stops.html_rows(stops),
    )


# -- the plots: each returns (svg or None, caption or why there is nothing to draw). The gids of the drawn
# data start with the plot's id ("pred-vs-peak-ram-points-COMPLETE"): _scoped keeps them, tests find them.


def _pred_vs_peak(data: ReportData) -> tuple[str | None, str]:
    shown = [r for r in RESOURCES if any(_pair(t, r) for t in data.trials)]
    if not shown:
        return None, "No trial has both a prediction and an observed peak."
    fig = _figure(len(shown) * 4.0 + 1.4, 4.0, cols=len(shown))
    for ax, r in zip(fig.axes, shown, strict=True):
        pairs = [(t, *pair) for t in data.trials if (pair := _pair(t, r))]
        scale = _scale(r)
        for state in sorted({t.state for t, _, _ in pairs}):
            group = [(t, pred, peak) for t, pred, peak in pairs if t.state == state]
            ax.scatter(
                [pred / scale for _, pred, _ in group],
                [peak / scale for _, _, peak in group],
                c=[COLORS[t.decision] for t, _, _ in group],
                marker=MARKERS.get(state, "o"),
                s=36,
                edgecolors="black",
                linewidths=0.4,
                zorder=3,
                gid=f"pred-vs-peak-{r}-points-{state}",
            )
        top = max(max(p, q) for _, p, q in pairs) / scale
        budgets = _budgets(data.trials, r)
        far = [b for b in budgets if b / scale > FAR * top]  # drawn, the points would crowd in a corner
        for i, budget in enumerate(b for b in budgets if b not in far):
            top = max(top, budget / scale)
            ax.axhline(budget / scale, color="#e03131", ls="--", lw=1, gid=f"pred-vs-peak-{r}-budget{_nth(i)}")
            ax.axhline(budget * data.soft / scale, color="#f08c00", ls=":", lw=1, gid=f"pred-vs-peak-{r}-soft{_nth(i)}")
        if far:
            ax.text(
                0.98,
                0.02,
                "budget " + ", ".join(fmt.figure(r, b) for b in far) + " (off the chart)",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=8,
                color="#e03131",
            )
        top *= 1.08
        ax.plot([0, top], [0, top], color="#495057", lw=0.8, gid=f"pred-vs-peak-{r}-identity")
        ax.set(
            xlim=(0, top),
            ylim=(0, top),
            xlabel=f"predicted peak ({UNITS[r]})",
            ylabel=f"observed peak ({UNITS[r]})",
            title=fmt.LABELS[r],
        )
        ax.set_aspect("equal", adjustable="box")
        ax.grid(alpha=0.3)
    _legend(
        fig,
        [t.decision for t in data.trials if any(_pair(t, r) for r in shown)],
        extra=[
            ("y = x", "#495057", "-"),
            ("budget", "#e03131", "--"),
            (f"soft line ({data.soft:.0%})", "#f08c00", ":"),
        ],
    )
    missing = [fmt.LABELS[r] for r in RESOURCES if r not in shown]
    note = f" No {', '.join(missing)} readings in this study." if missing else ""
    if "vram" not in shown:
        note += " VRAM is read through NVML only where a GPU exists."
    if any(t.decision is Decision.OUT_OF_MEMORY for t in data.trials):
        note += " Trials that ran out of memory are left out: their peak is only the least they needed."
    return _svg(fig), (
        f"Every trial with both figures; above the line = under-predicted. Marker shape is the "
        f"trial's final state (circle COMPLETE, square PRUNED).{note}"
    )


def _timelines(data: ReportData) -> tuple[str | None, str]:
    trials = [data.trial(n) for n in data.timeline_trials]
    if not trials:
        return None, "No stopped or admitted trial has a recorded timeline."
    vram = any(p[3] is not None for t in trials for p in t.record.timeline)
    fig = _figure(9.0, 4.0 * (2 if vram else 1), rows=2 if vram else 1)
    reds, greens = _shades("Reds", trials, Decision.STOPPED), _shades("Greens", trials, Decision.ADMITTED)
    for ax, (r, column) in zip(fig.axes, [("ram", 1), ("vram", 3)], strict=False):
        for t in trials:
            color = (reds if t.decision is Decision.STOPPED else greens).get(t.number, COLORS[t.decision])
            points = [(p[0], value) for p in t.record.timeline if (value := p[column]) is not None]
            ax.plot(
                [seconds for seconds, _ in points],
                [value / MiB for _, value in points],
                color=color,
                lw=1.6,
                marker=".",
                ms=3,
                label=f"#{t.number} {t.decision.value}",
                gid=f"timelines-{r}-{t.number}",
            )
            if t.decision is Decision.STOPPED and points:  # the last reading: where the trial was stopped
                ax.plot([points[-1][0]], [points[-1][1] / MiB], color=color, marker="X", ms=8, ls="")
        for i, budget in enumerate(_budgets(trials, r)):
            ax.axhline(
                budget / MiB,
                color="#e03131",
                ls="--",
                lw=1,
                label=None if i else "budget",
                gid=f"timelines-{r}-budget{_nth(i)}",
            )
            ax.axhline(
                budget * data.soft / MiB,
                color="#f08c00",
                ls=":",
                lw=1,
                label=None if i else f"soft line ({data.soft:.0%})",
                gid=f"timelines-{r}-soft{_nth(i)}",
            )
        ax.set(
            xlabel="seconds since the trial started",
            ylabel=f"{'RSS' if r == 'ram' else 'VRAM'} (MiB)",
            title="process RSS" if r == "ram" else "process VRAM",
        )
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8, ncols=2)
    stopped = sum(t.decision is Decision.STOPPED for t in trials)
    which = (
        f"The {stopped} stopped trial{'s' if stopped > 1 else ''} (X: its last reading) and"
        if stopped
        else "No trial was stopped;"
    ) + " the admitted trials with the highest peaks"
    return _svg(fig), f"{which}, as the monitor read the whole process (downsampled, maxima kept)."


def _decisions(data: ReportData) -> tuple[str | None, str]:
    fig = _figure(9.0, 3.2)
    ax = fig.axes[0]
    rows = list(Decision)
    for state in sorted({t.state for t in data.trials}):
        group = [t for t in data.trials if t.state == state]
        ax.scatter(
            [t.number for t in group],
            [rows.index(t.decision) for t in group],
            c=[COLORS[t.decision] for t in group],
            marker=MARKERS.get(state, "o"),
            s=40,
            edgecolors="black",
            linewidths=0.4,
            zorder=3,
            gid=f"decisions-points-{state}",
        )
    ax.set_yticks(range(len(rows)), [d.value for d in rows])
    ax.set(xlabel="trial number", ylim=(-0.6, len(rows) - 0.4), title="what the guard did, trial by trial")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    counts = ", ".join(f"{k} {v}" for k, v in data.counts.items() if v)
    return _svg(fig), f"{counts}. Marker shape is the trial's final state (circle COMPLETE, square PRUNED)."


def _breakdown(data: ReportData) -> tuple[str | None, str]:
    if data.largest_admitted is None:
        return None, "No admitted trial with a recorded footprint."
    t = data.trial(data.largest_admitted)
    fp = Footprint.from_dict(t.record.breakdown)
    shown = [r for r in ("ram", "vram") if getattr(fp, r)]
    if not shown:
        return None, f"Trial #{t.number}'s footprint predicts no memory."
    fig = _figure(9.0, 0.9 + 0.32 * (len(fp.components) + 2) * len(shown), rows=len(shown))
    for ax, r in zip(fig.axes, shown, strict=True):
        parts = [c for c in fp.components if getattr(c, r)]
        names = [c.name for c in parts] + ["predicted total", "observed peak"]
        sizes = [getattr(c, r) for c in parts] + [getattr(fp, r), t.figure("peak", r) or 0]
        colors = ["#74c0fc"] * len(parts) + [COLORS[Decision.ADMITTED], "#495057"]
        bars = ax.barh(range(len(names)), [s / MiB for s in sizes], color=colors)
        for i, (bar, size) in enumerate(zip(bars, sizes, strict=True)):
            bar.set_gid(f"breakdown-{r}-bar-{i}")
            ax.annotate(
                fmt.figure(r, size),
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        budget = t.figure("budget", r)
        if budget is not None:
            ax.axvline(budget / MiB, color="#e03131", ls="--", lw=1, gid=f"breakdown-{r}-budget")
            ax.axvline(budget * data.soft / MiB, color="#f08c00", ls=":", lw=1, gid=f"breakdown-{r}-soft")
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set(xlabel=f"{fmt.LABELS[r]} (MiB)", title=f"trial #{t.number}: {fmt.LABELS[r]} by component")
        ax.margins(x=0.15)
        ax.grid(axis="x", alpha=0.3)
    budgets = ", ".join(f"{fmt.LABELS[r]} {fmt.figure(r, t.figure('budget', r))}" for r in shown)
    return _svg(fig), (
        f"Trial #{t.number} ({fmt.params(t.params)}): the admitted trial with the largest "
        f"predicted RAM; dashed: the budget ({budgets}), dotted: the soft line."
    )


# -- helpers ------------------------------------------------------------------------------------------------


def _pair(t: GuardedTrial, r: str) -> tuple[int, int] | None:
    """A trial's (predicted, observed) peak of ``r``; None where one is missing or, for a trial that ran out
    of memory, the peak is only the least it needed."""
    if t.decision is Decision.OUT_OF_MEMORY:
        return None
    pred, peak = t.predicted_level(r), t.figure("peak", r)
    return (pred, peak) if pred is not None and peak is not None and (pred or peak) else None


def _budgets(trials: list[GuardedTrial], r: str) -> list[int]:
    """The distinct budgets of ``r`` these trials ran under, lowest first (none where unbudgeted)."""
    return sorted({budget for t in trials if (budget := t.figure("budget", r)) is not None})


def _nth(i: int) -> str:
    """Suffix for the i-th line of a kind in one plot (a study whose budget changed has several)."""
    return f"-{i}" if i else ""


def _scale(r: str) -> float:
    return 1 if r == "threads" else MiB


def _shades(cmap: str, trials: list[GuardedTrial], decision: Decision) -> dict[int, Any]:
    from matplotlib import colormaps

    numbers = [t.number for t in trials if t.decision is decision]
    ramp = colormaps[cmap]
    return {n: ramp(0.55 + 0.4 * i / max(len(numbers) - 1, 1)) for i, n in enumerate(numbers)}


def _figure(width: float, height: float, *, rows: int = 1, cols: int = 1):  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    fig.subplots(rows, cols, squeeze=False)
    return fig


def _legend(fig: Any, decisions: list[Decision], *, extra: list[tuple[str, str, str]]) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], ls="", marker="o", color=COLORS[d], markeredgecolor="black", label=d.value)
        for d in Decision
        if d in decisions
    ]
    handles += [Line2D([], [], color=c, ls=ls, label=label) for label, c, ls in extra]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: no XML declaration or DOCTYPE inside HTML


def _scoped(svg: str, scope: str) -> str:
    """Prefix the ids of one inline SVG with its plot's id: matplotlib numbers ids per figure (``axes_1``,
    ``line2d_1``), so the SVGs of one page would share them. The gids set here already start with the plot's
    id and are kept as they are."""
    svg = re.sub(rf'id="(?!{scope})([^"]+)"', rf'id="{scope}-\1"', svg)
    return re.sub(rf'(href="#|url\(#)(?!{scope})', rf"\1{scope}-", svg)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _summary(data: ReportData) -> str:
    budget = ", ".join(f"{fmt.LABELS[r]} {fmt.figure(r, v)}" for r, v in data.budget.items() if v is not None)
    counts = "".join(
        f'<tr><td><span class="dot" style="background:{COLORS[Decision(k)]}"></span>{_e(k)}</td>'
        f'<td class="num">{v}</td></tr>'
        for k, v in data.counts.items()
    )
    quality = "".join(f"<li>{_e(fmt.quality_line(q))}</li>" for q in data.quality.values())
    return (
        f"<h1>memprune report: study {_e(data.study_name)}</h1>"
        f"<p>{data.n_trials} trials, {len(data.trials)} guarded; budget per trial {_e(budget or 'none')} "
        f"(soft line {data.soft:.0%}).</p>"
        f'<div class="cols"><table><tr><th>decision</th><th>trials</th></tr>{counts}</table>'
        f"<div><h3>Prediction quality</h3><p>trials that ran to the end; error = (peak - pred) / peak, "
        f"positive = under-predicted; a learned increment counts with the usage its trial started from</p>"
        f"<ul>{quality}</ul><p>{_e(margin_line(data))}</p></div></div>"
    )


def _notable(data: ReportData) -> str:
    rows = (
        "".join(
            f'<tr><td class="num">{t.number}</td><td>{t.state}</td>'
            f'<td class="nowrap"><span class="dot" style="background:{COLORS[t.decision]}"></span>'
            f"{t.decision.value}</td>"
            f"<td>{_e(fmt.params(t.params))}</td>"
            + "".join(f'<td class="num">{_figures(t, kind)}</td>' for kind in ("pred", "peak", "budget"))
            + f"<td>{_e(fmt.reason(t))}</td></tr>"
            for t in data.notable
        )
        or '<tr><td colspan="8">none: every guarded trial was admitted or unchecked</td></tr>'
    )
    return (
        f'<section id="notable"><h2>Rejected, clamped, soft-pruned, stopped and out-of-memory trials</h2>'
        f"<table><tr><th>#</th><th>state</th><th>decision</th><th>params</th><th>predicted</th><th>peak</th>"
        f"<th>budget</th><th>reason</th></tr>{rows}</table></section>"
    )


def _running(data: ReportData) -> str:
    """The trials still RUNNING, and whether their runner is alive (nothing when none is)."""
    if not data.running:
        return ""
    rows = "".join(
        f'<tr><td class="num">{t.number}</td><td>RUNNING</td><td>{running_word(t)}</td>'
        f"<td>{_e(fmt.params(t.params))}</td><td>{_e(t.note)}</td></tr>"
        for t in data.running
    )
    return (
        f'<section id="running"><h2>Running trials</h2><table><tr><th>#</th><th>state</th><th>runner</th>'
        f"<th>params</th><th>note</th></tr>{rows}</table></section>"
    )


def _figures(t: GuardedTrial, kind: str) -> str:
    return "<br>".join(_e(f"{fmt.LABELS[r]} {fmt.figure(r, t.shown(kind, r))}") for r in fmt.resources(t))


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>
body {{ font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; margin: 24px auto; max-width: 1200px;
       color: #212529; padding: 0 16px; font-size: 14px; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }} h3 {{ font-size: 15px; margin: 0; }}
table {{ border-collapse: collapse; margin: 8px 0; }}
th, td {{ border-bottom: 1px solid #dee2e6; padding: 3px 8px; text-align: left; vertical-align: top; }}
td.num {{ text-align: right; white-space: nowrap; }}
td.nowrap {{ white-space: nowrap; }}
.cols {{ display: flex; gap: 40px; align-items: flex-start; }}
.dot {{ display: inline-block; width: 9px; height: 9px; border-radius: 50%; margin-right: 6px; }}
section.plot svg {{ max-width: 100%; height: auto; display: block; }}
.caption, .empty {{ color: #495057; font-size: 13px; }}
</style>
</head>
<body>
{summary}
{plots}
{notable}
</body>
</html>
"""
