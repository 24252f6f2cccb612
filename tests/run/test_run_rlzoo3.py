"""rl-zoo3's own hyperparameter search, unchanged, under ``memprune run`` with ``--n-jobs 2``: the smoke run
of ``studies/rlzoo3_run.py``. rl-zoo3 exits 0 and writes its own report (and pickles its study with the
guarded sampler in it); each trial ran in its own process with its own budget, and has a record."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from optuna_memprune import records

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rl_zoo3") is None,
    reason="rl_zoo3 is not importable (the test extra installs rl-zoo3==2.9.2)",
)


def test_rl_zoo3_with_two_jobs_runs_each_trial_in_its_own_process_with_a_record(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("MEMPRUNE_RUN", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "rlzoo3_run.py"), "--smoke", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    last = proc.stdout.splitlines()[-1] if proc.stdout else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + (tmp_path / "stderr.txt").read_text()[-3000:]
    assert re.match(
        r"RLZOO3RUN case=dqn-cartpole exit=0 report=1 trials=2 records=2 predicted=2 .* over_budget=0 "
        r"rejected_under_line=0 ",
        last,
    ), last
    assert len(list((tmp_path / "logs" / "dqn").glob("report_CartPole-v1_*.pkl"))) == 1  # rl-zoo3 pickled its study
    assert (
        "memprune: 2 jobs run as one process per trial (2 at a time; the objective sent by cloudpickle)" in proc.stdout
    ), proc.stdout
    url = f"sqlite:///{tmp_path / 'zoo.db'}"
    trials = optuna.load_study(study_name="dqn-cartpole", storage=url).get_trials(deepcopy=False)
    recs = [records.read(t.user_attrs) for t in trials]
    assert all(r.host and r.enforcement and r.peak_ram < 3 * 2**30 for r in recs), recs  # the runner's records
    errors = sorted(abs(r.pred_ram - r.peak_ram) / r.peak_ram for r in recs if r.decision.value == "admitted")
    print("prediction errors:", [f"{e:.1%}" for e in errors])
    assert errors and errors[0] < 0.25, errors  # the accuracy bar itself is measured by the study's full cases
    assert proc.stdout.splitlines()[-4].startswith("memprune: 2 trials guarded in study 'dqn-cartpole' ("), proc.stdout
