"""One case of the bad-input probe, in a fresh process: ``python -m _bad_inputs.child CODE``.

Runs CODE (a few lines of a user's script) with the names below at hand, in the case's own directory. An
error of the documented kinds (``ValueError``, ``TypeError``, the package's ``MemPruneError``, or the user's
own ``UserError`` raised through) is printed as one line ``Type: message`` and exits 1, as a user reads it;
anything else escapes with its traceback, which the probe counts as such.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any


def helpers() -> dict[str, Any]:
    import optuna
    import psutil

    import optuna_memprune as omp
    from optuna_memprune import report

    from . import faults
    from . import objectives as o

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def guard(footprint=o.footprint, budget=None, **kw):
        kw.setdefault("search_space", o.SPACE)
        return omp.MemoryGuard(footprint, budget if budget is not None else omp.Budget(ram="1GiB"), **kw)

    def study(g=None, *, name="s", url="sqlite:///study.db", sampler=None, wrap=True, **kw):
        sampler = sampler or optuna.samplers.RandomSampler(seed=0)
        if wrap:
            g = g or guard()
            sampler, kw["pruner"] = g.wrap_sampler(sampler), g.wrap_pruner(kw.get("pruner"))
        return optuna.create_study(storage=url, study_name=name, load_if_exists=True, sampler=sampler, **kw)

    def run(g=None, objective=o.quick, *, n_trials=2, url="sqlite:///study.db", s=None, **kw):
        """``omp.optimize`` on a small SQLite study, one process per trial."""
        g = g or guard()
        kw.setdefault("progress", False)
        omp.optimize(s or study(g, url=url), objective, guard=g, n_trials=n_trials, **kw)

    def inproc(g=None, objective=o.quick, *, n_trials=2, url="sqlite:///study.db", **kw):
        """``study.optimize(guard.wrap_objective(...))``: the trials in this process."""
        g = g or guard()
        study(g, url=url).optimize(g.wrap_objective(objective), n_trials=n_trials, **kw)

    # -- for the setups: files put in a bad state before the case runs
    def write(path, data):
        Path(path).write_bytes(data if isinstance(data, bytes) else data.encode())

    def calibration() -> Path:
        """The calibration file of the case's cache dir (a copy of the probe's pre-filled one)."""
        return next(Path(os.environ["MEMPRUNE_CACHE_DIR"]).glob("calibration-*.json"))

    def edit_calibration(edit):
        data = json.loads(calibration().read_text())
        calibration().write_text(json.dumps(edit(data)))

    def ledger_file() -> Path:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
        return Path(os.environ["MEMPRUNE_CACHE_DIR"]) / f"ledger-{host}.sqlite"

    return {
        "omp": omp,
        "optuna": optuna,
        "report": report,
        "o": o,
        "faults": faults,
        "MiB": o.MiB,
        "GiB": 2**30,
        "host_total": psutil.virtual_memory().total,
        "guard": guard,
        "study": study,
        "run": run,
        "inproc": inproc,
        "write": write,
        "calibration": calibration,
        "edit_calibration": edit_calibration,
        "ledger_file": ledger_file,
        "os": os,
        "Path": Path,
    }


def _documented(exc: BaseException) -> bool:
    from optuna_memprune import MemPruneError

    from .objectives import UserError

    seen = exc
    while seen is not None:
        if isinstance(seen, UserError):
            return True
        seen = seen.__cause__
    return isinstance(exc, (ValueError, TypeError, MemPruneError))


def main() -> None:
    code = sys.argv[1]
    namespace = helpers()
    try:
        exec(compile(code, "<case>", "exec"), namespace)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the case's outcome
        if not _documented(exc):
            raise
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
