"""The fault drill's smallest run (1 pseudo-host x 3 workers, 15 s, one of each fault): its own PostgreSQL
server, a worker and a trial process SIGKILLed, the server restarted, a dead runner's reservations."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_faults.py"
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_fault_drill_ends_every_trial_without_overcommit_or_abort() -> None:
    if not (shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb")):
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are missing; .ci/run should install them")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install -e '.[test]')")
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--hosts",
            "1",
            "--workers-per-host",
            "3",
            "--duration",
            "15",
            "--kill-workers",
            "1",
            "--kill-trials",
            "1",
            "--host-ram-mib",
            "512",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("FAULTS workers=3 "), run.stdout[-3000:]
    figures = dict(part.split("=") for part in last.split()[1:])
    assert int(figures["trials"]) > 0
    for name in ("overcommit", "running_left", "lost", "study_aborted"):
        assert figures[name] == "0", (name, run.stdout[-3000:])
    # the ledger's transactions were logged and read, with the CPU each took in its worker's thread
    assert 0 < float(figures["admit_txn_cpu_p99_ms"]) <= float(figures["admit_txn_p99_ms"]), last
    assert "trials of dead runners failed with the reason:" in run.stdout  # the killed worker's trials, if any
