"""Review a guarded study: study -> ReportData (plain data) -> terminal table, JSON or self-contained HTML.

Reads the trial record through ``records`` only and prints nothing (the CLI prints). Not imported
by ``import optuna_memprune``; matplotlib and optuna-dashboard load only where they are used.

Examples:
    >>> from optuna_memprune import report
    >>> data = report.build(report.load("sqlite:///studies/demo.db", "demo"))  # doctest: +SKIP
    >>> open("demo.html", "w").write(report.render_html(data))                  # doctest: +SKIP
"""

from __future__ import annotations

import json

from . import _learned
from ._dashboard import save_notes, trial_note
from ._data import GuardedTrial, Margin, Quality, ReportData, ReportError, RunningTrial, build, load
from ._html import render as render_html
from ._table import render as render_table

__all__ = [
    "ReportData",
    "GuardedTrial",
    "RunningTrial",
    "Quality",
    "Margin",
    "ReportError",
    "load",
    "build",
    "render_table",
    "render_json",
    "render_html",
    "save_notes",
    "trial_note",
]


def render_json(data: ReportData) -> str:
    """The report as JSON text: ``data.to_json_dict()`` with stable keys (docs/report.md), and
    ``learned`` (its rows and quality) when some trial has a learned prediction."""
    out = data.to_json_dict()
    learned = _learned.json_dict(data)
    if learned is not None:
        out["learned"] = learned
    return json.dumps(out, indent=1, allow_nan=False)
