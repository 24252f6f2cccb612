"""The terminal report: ReportData -> renderables (returned, never printed): rich's where rich is installed,
else plain-text ones with the same rows (``_console``).

Knows the report data; the CLI decides where the renderables go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._console import parts
from ..records import RESOURCES, Decision
from . import _format as fmt
from . import _learned
from ._stops import forecast_stops
from ._stops import table as forecast_table

if TYPE_CHECKING:
    from rich.console import Group as RichGroup

    from .._console import Group as PlainGroup
    from ._data import GuardedTrial, ReportData, RunningTrial
    from ._stops import TerminalTable

    #: The terminal report: rich's group where rich is installed, else ``_console``'s plain stand-in.
    TerminalGroup = RichGroup | PlainGroup

NO_MARGIN = "no learned margin (in-process study)"


def render(data: ReportData) -> TerminalGroup:
    """The terminal report: header, counts by decision, the notable trials, the RUNNING ones (if any),
    prediction quality, margin."""
    ui = parts()
    Group, Table, Text = ui.Group, ui.Table, ui.Text

    budget = ", ".join(f"{fmt.LABELS[r]} {fmt.figure(r, v)}" for r, v in data.budget.items() if v is not None)
    header = Text.assemble(
        (f"study {data.study_name!r}", "bold"),
        f": {data.n_trials} trials, {len(data.trials)} guarded; budget per trial {budget or 'none'} "
        f"(soft line {data.soft:.0%})",
    )

    states = sorted({t.state for t in data.trials})
    counts = Table(title="decisions", title_justify="left", box=None, pad_edge=False)
    counts.add_column("decision")
    counts.add_column("trials", justify="right")
    for state in states:
        counts.add_column(state, justify="right")
    for d in Decision:
        by_state = [sum(t.decision is d and t.state == s for t in data.trials) for s in states]
        counts.add_row(d.value, str(data.counts[d.value]), *(str(n) if n else "-" for n in by_state))

    notable = Table(
        title="rejected, clamped, soft-pruned, stopped and out-of-memory trials",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for head, justify in (
        ("#", "right"),
        ("state", "left"),
        ("decision", "left"),
        ("params", "left"),
        ("predicted", "right"),
        ("peak", "right"),
        ("budget", "right"),
        ("reason", "left"),
    ):
        notable.add_column(
            head, justify=justify, no_wrap=head in ("#", "state", "decision", "predicted", "peak", "budget")
        )
    for t in data.notable:
        notable.add_row(
            str(t.number),
            t.state,
            t.decision.value,
            fmt.params(t.params),
            *(_figures(t, kind) for kind in ("pred", "peak", "budget")),
            fmt.reason(t),
        )
    if not data.notable:
        notable.add_row("", "", "none", "", "", "", "", "every guarded trial was admitted or unchecked")

    quality = Table(title="prediction quality", title_justify="left", box=None, pad_edge=False)
    for head in ("resource", "trials", "median error", "worst error", "under-predicted"):
        quality.add_column(head, justify="left" if head == "resource" else "right")
    for r in RESOURCES:
        q = data.quality[r]
        if q.n == 0:
            quality.add_row(fmt.LABELS[r], "0", "-", "-", "-")
        else:
            quality.add_row(
                fmt.LABELS[r],
                str(q.n),
                fmt.pct(q.median_rel_error),
                f"{fmt.pct(q.worst_rel_error)} (#{q.worst_trial})",
                str(q.under_predicted),
            )

    note = Text(
        "over the trials that ran to the end (COMPLETE); error = (peak - pred) / peak, + = under-predicted; a "
        "learned increment counts with the usage its trial started from"
    )
    running = [Text(), _running(data)] if data.running else []
    stops = forecast_stops(data.trials)
    running += [Text(), forecast_table(stops)] if stops else []
    learned_table = _learned.table(data)
    learned = [Text(), learned_table, *(Text(line) for line in _learned.lines(data))] if learned_table else []
    lowered = [Text(line) for line in override_lines(data)]
    report: TerminalGroup = Group(
        header,
        *lowered,
        Text(),
        counts,
        Text(),
        notable,
        *running,
        Text(),
        quality,
        note,
        *learned,
        Text(),
        Text(margin_line(data)),
    )
    return report


def override_lines(data: ReportData) -> list[str]:
    """One line per fixed hyperparameter ``memprune run --clamp-fixed`` lowered, with the -params that
    replays a trial as it ran."""
    return [
        f"fixed {name} lowered {was} -> {ran} by --clamp-fixed on {n} trials (the stored params plus this "
        f"are what ran; replay a trial with -params {name}:{ran})"
        for (name, was, ran), n in data.overrides.items()
    ]


def _running(data: ReportData) -> TerminalTable:
    """The trials still RUNNING in the storage, and whether their runner is alive."""
    table: TerminalTable = parts().Table(title="running trials", title_justify="left", box=None, pad_edge=False)
    for head in ("#", "state", "runner", "params", "note"):
        table.add_column(head, justify="right" if head == "#" else "left", no_wrap=head in ("#", "state", "runner"))
    for t in data.running:
        table.add_row(str(t.number), "RUNNING", running_word(t), fmt.params(t.params), t.note)
    return table


def running_word(t: RunningTrial) -> str:
    """``alive``, ``dead`` or ``unknown``: the runner of a RUNNING trial, in one word."""
    return {True: "alive", False: "dead", None: "unknown"}[t.runner_alive]


def margin_line(data: ReportData) -> str:
    if data.margin is None:
        return f"learned margin: {NO_MARGIN}"
    factors = ", ".join(f"{fmt.LABELS.get(r, r)} x{f:.3f}" for r, f in data.margin.factors.items())
    return f"learned margin (trial #{data.margin.trial}): {factors}"


def _figures(t: GuardedTrial, kind: str) -> str:
    return "\n".join(f"{fmt.LABELS[r]} {fmt.figure(r, t.shown(kind, r))}" for r in fmt.resources(t))
