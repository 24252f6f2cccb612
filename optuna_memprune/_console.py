"""Terminal output with or without rich (the ``report`` extra): the few rich classes the CLI and the report
use (``Table``, ``Text``, ``Group``) and a ``show`` that prints them.

With rich installed, ``parts`` gives rich's own classes and ``show`` prints through a rich Console.
Without it, plain stand-ins give the same rows as aligned text (no colour, no wrapping), so a core install
(``pip install optuna-memprune``) still prints every table.

Owns only rendering; knows nothing of trials, reports or footprints.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any, TextIO


class Text:
    """Plain stand-in for ``rich.text.Text``: a line of text (styles dropped)."""

    def __init__(self, text: str = "") -> None:
        self.plain = text

    @classmethod
    def assemble(cls, *parts: str | tuple[str, str]) -> Text:
        return cls("".join(p[0] if isinstance(p, tuple) else p for p in parts))

    def __str__(self) -> str:
        return self.plain


class Table:
    """Plain stand-in for ``rich.table.Table``: a title, a header, aligned columns (a cell's lines stacked),
    an optional footer row.

    Examples:
        >>> t = Table(title="decisions", show_footer=True)
        >>> t.add_column("decision", footer="all"); t.add_column("trials", justify="right", footer="12")
        >>> t.add_row("admitted", "9"); t.add_row("rejected", "3")
        >>> print(t)
        decisions
        decision  trials
        admitted       9
        rejected       3
        all           12
    """

    def __init__(self, title: str | None = None, show_footer: bool = False, **_: Any) -> None:
        self.title, self._footer = title, show_footer
        self._heads: list[tuple[str, str, str]] = []  # header, justify, footer
        self._rows: list[tuple[str, ...]] = []

    def add_column(self, header: str = "", justify: str = "left", footer: str = "", **_: Any) -> None:
        self._heads.append((header, justify, footer))

    def add_row(self, *cells: Any) -> None:
        self._rows.append(tuple(str(c) for c in cells))

    def __str__(self) -> str:
        rows = [tuple(h for h, _, _ in self._heads), *self._rows]
        if self._footer:
            rows.append(tuple(f for _, _, f in self._heads))
        lines = []  # each row as its lines: a cell with newlines spans several
        for row in rows:
            cells = [c.split("\n") for c in row] + [[""]] * (len(self._heads) - len(row))
            lines += [tuple(c[i] if i < len(c) else "" for c in cells) for i in range(max(map(len, cells)))]
        widths = [max(len(line[i]) for line in lines) for i in range(len(self._heads))]
        out = [] if self.title is None else [self.title]
        for line in lines:
            out.append(
                "  ".join(
                    c.rjust(w) if j == "right" else c.ljust(w)
                    for c, w, (_, j, _) in zip(line, widths, self._heads, strict=True)
                ).rstrip()
            )
        return "\n".join(out)


class Group:
    """Plain stand-in for ``rich.console.Group``: renderables one under the other."""

    def __init__(self, *renderables: Any) -> None:
        self.renderables = list(renderables)

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.renderables)


def parts() -> SimpleNamespace:
    """``Table``, ``Text`` and ``Group``: rich's where rich is installed, else the plain stand-ins above."""
    try:
        from rich.console import Group as RichGroup
        from rich.table import Table as RichTable
        from rich.text import Text as RichText
    except ImportError:
        return SimpleNamespace(Table=Table, Text=Text, Group=Group)
    return SimpleNamespace(Table=RichTable, Text=RichText, Group=RichGroup)


def show(*renderables: Any, file: TextIO | None = None) -> None:
    """Print renderables of ``parts`` to ``file`` (default stdout): through rich where it is installed
    (a terminal's width; 200 columns and no colour into a pipe or a file), else as plain text."""
    out = sys.stdout if file is None else file
    try:
        from rich.console import Console
    except ImportError:
        for r in renderables:
            print(r, file=out)
        return
    console = Console(file=out) if file is None and out.isatty() else Console(file=out, width=200, no_color=True)
    for r in renderables:
        console.print(r)
