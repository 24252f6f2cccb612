"""The report's forecast stops: the trials stopped because their RSS was projected over the budget at their
last step, as rows (table, JSON, HTML) and as a plot of the observed curve beside the projection.

Reads the record's ``forecast`` field of ``forecast_stopped`` trials only; knows nothing of how the
projection was fitted, and prints nothing. matplotlib (and rich, where installed) load at the point of use.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import Decision
from ..units import format_bytes

if TYPE_CHECKING:
    from rich.table import Table as RichTable

    from .._console import Table as PlainTable

    #: A table for the terminal: rich's where it is installed, else ``_console``'s plain stand-in.
    TerminalTable = RichTable | PlainTable

MiB = 2**20
PLOTTED = 6  # the last forecast stops drawn


@dataclass(frozen=True)
class ForecastStop:
    """One trial stopped on the forecast. Bytes are ints; ``elapsed_s`` is the trial's time at the stop.

    ``end_s`` estimates when the trial would have reached its last step at the pace it had (elapsed
    seconds x horizon / step): how much time the stop saved.
    """

    number: int
    step: int
    horizon: int
    level: int
    projected: int
    limit: int
    peak_ram: int | None
    elapsed_s: float
    timeline: list[tuple[float, int, int, int | None]]

    @property
    def progress(self) -> float:
        """The share of the run done at the stop."""
        return self.step / self.horizon

    @property
    def end_s(self) -> float:
        return self.elapsed_s * self.horizon / max(self.step, 1)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "step": self.step,
            "horizon": self.horizon,
            "level": self.level,
            "projected": self.projected,
            "limit": self.limit,
            "peak_ram": self.peak_ram,
            "elapsed_s": self.elapsed_s,
            "end_s": round(self.end_s, 3),
        }


def forecast_stops(trials: Sequence[Any]) -> list[ForecastStop]:
    """The trials (``report.GuardedTrial``) stopped on the forecast that carry its fit, in number order."""
    out = []
    for t in trials:
        f = t.record.forecast
        if t.decision is Decision.FORECAST_STOPPED and f.get("horizon") and f.get("step"):
            out.append(
                ForecastStop(
                    t.number,
                    int(f["step"]),
                    int(f["horizon"]),
                    int(f["level"]),
                    int(f["projected"]),
                    int(f["limit"]),
                    t.record.peak_ram,
                    float(f.get("elapsed_s", 0.0)),
                    list(t.record.timeline),
                )
            )
    return out


def table(stops: Sequence[ForecastStop]) -> TerminalTable:
    """The forecast stops as a table (rich's where installed; one row each)."""
    from .._console import parts

    out: TerminalTable = parts().Table(title="forecast stops", title_justify="left", box=None, pad_edge=False)
    for head in ("#", "stopped at step", "of", "done", "RSS then", "projected", "budget", "time", "est. full run"):
        out.add_column(head, justify="right", no_wrap=True)
    for s in stops:
        out.add_row(*_cells(s))
    return out


def _cells(s: ForecastStop) -> list[str]:
    return [
        str(s.number),
        f"{s.step:,}",
        f"{s.horizon:,}",
        f"{s.progress:.0%}",
        format_bytes(s.level),
        format_bytes(s.projected),
        format_bytes(s.limit),
        f"{s.elapsed_s:.1f} s",
        f"{s.end_s:.1f} s",
    ]


def html_rows(stops: Sequence[ForecastStop]) -> str:
    """The forecast stops as an HTML section (nothing when there are none)."""
    if not stops:
        return ""
    heads = "".join(
        f"<th>{h}</th>"
        for h in ("#", "stopped at step", "of", "done", "RSS then", "projected", "budget", "time", "est. full run")
    )
    rows = "".join(
        "<tr>" + "".join(f'<td class="num">{html.escape(c)}</td>' for c in _cells(s)) + "</tr>" for s in stops
    )
    return f'<section id="forecast-stops"><h2>Forecast stops</h2><table><tr>{heads}</tr>{rows}</table></section>'


def plot(stops: Sequence[ForecastStop]) -> tuple[Any, str] | None:
    """A matplotlib Figure of the observed RSS of the last ``PLOTTED`` forecast stops (solid, to the stop)
    and the projection that stopped each (dashed, to its estimated end), with the budget; and its caption.
    ``None`` when there is nothing to draw."""
    drawn = [s for s in stops if s.timeline][-PLOTTED:]
    if not drawn:
        return None
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 4.0), layout="constrained")
    ax = fig.subplots()
    ramp = colormaps["RdPu"]
    for i, s in enumerate(drawn):
        color = ramp(0.55 + 0.4 * i / max(len(drawn) - 1, 1))
        ax.plot(
            [p[0] for p in s.timeline],
            [p[1] / MiB for p in s.timeline],
            color=color,
            lw=1.6,
            label=f"#{s.number} observed",
            gid=f"forecast-observed-{s.number}",
        )
        ax.plot(
            [s.elapsed_s, s.end_s],
            [s.level / MiB, s.projected / MiB],
            color=color,
            lw=1.2,
            ls="--",
            label=f"#{s.number} projected to step {s.horizon:,}",
            gid=f"forecast-projected-{s.number}",
        )
        ax.plot([s.elapsed_s], [s.level / MiB], color=color, marker="X", ms=8, ls="")
    for i, limit in enumerate(sorted({s.limit for s in drawn})):
        ax.axhline(
            limit / MiB, color="#e03131", ls=":", lw=1, label=None if i else "budget", gid=f"forecast-budget-{i}"
        )
    ax.set(xlabel="seconds since the trial started", ylabel="RSS (MiB)", title="stopped on the forecast")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig, (
        "Each trial's observed RSS up to its stop (X) and the projection that stopped it, drawn to "
        "when it would have reached its last step at the pace it had (elapsed x horizon / step)."
    )
