"""``memprune report``: a guarded study read from its storage, rendered as a table, JSON or HTML, written to
standard output or a file, and optionally its optuna-dashboard notes written into the storage.

Part of the CLI layer: it prints; the report itself is built and rendered by ``optuna_memprune.report``.
"""

from __future__ import annotations

import argparse
import sys

from ..exceptions import MemPruneError
from ..storages import check_writable, first_line, shown
from ._common import output_format, storage_url


def cmd_report(args: argparse.Namespace) -> int:
    import optuna

    from .. import report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(args)
    if args.dashboard_notes:
        check_writable(url)  # the notes are written into the storage: say why it cannot be, before reading
    study = report.load(url, args.study)
    data = report.build(study)
    if args.dashboard_notes:
        try:
            changed = report.save_notes(study)
        except MemPruneError:
            raise
        except Exception as exc:  # noqa: BLE001 - the storage's own errors (a server gone, a locked file)
            raise MemPruneError(f"cannot write the dashboard notes into {shown(url)}: {first_line(exc)}") from None
        print(
            f"optuna-dashboard notes: {changed} of {len(data.trials)} guarded trials written or refreshed",
            file=sys.stderr,
        )
    fmt = output_format(args)
    try:
        if fmt == "table":
            from .._console import show

            if args.output:
                with open(args.output, "w", encoding="utf-8") as f:
                    show(report.render_table(data), file=f)
            else:
                show(report.render_table(data))
        else:
            text = report.render_json(data) if fmt == "json" else report.render_html(data)
            if args.output:
                with open(args.output, "w", encoding="utf-8") as f:
                    f.write(text + "\n")
            else:
                sys.stdout.write(text + "\n")
    except OSError as exc:
        raise MemPruneError(f"cannot write the report to {args.output!r}: {exc.strerror or exc}") from None
    if args.output:
        print(f"{fmt} report of study {data.study_name!r} ({len(data.trials)} guarded trials) -> {args.output}")
    return 0
