"""The README's main job: the guarded demo study runs end to end and leaves a record on every trial."""

import os
import subprocess
import sys
from pathlib import Path

import optuna

from optuna_memprune import read_record

ROOT = Path(__file__).resolve().parents[2]


def test_demo_study_runs_and_records_every_trial(tmp_path):
    storage = f"sqlite:///{tmp_path / 'demo.db'}"
    out = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "demo.py"), "--trials", "6", "--storage", storage],
        capture_output=True,
        text=True,
        timeout=600,
        # the calibration recheck is tests/estimate/test_recheck.py's subject: here it would only add a probe
        env={**os.environ, "MEMPRUNE_RECHECK": "0"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "at launch:" in out.stdout and "wall time" in out.stdout
    # the first trial runs unchecked (the space is not known before it), however it ends (soft-pruned in some runs)
    launch = next(line for line in out.stdout.splitlines() if line.startswith("at launch:"))
    assert "unchecked" in launch, launch
    trials = optuna.load_study(study_name="demo", storage=storage).trials
    assert len(trials) == 6
    for t in trials:
        assert t.state.is_finished(), t
        record = read_record(t.user_attrs)
        assert record is not None and record.decision is not None and record.budget_ram == 768 * 2**20
