"""rl-zoo3's own hyperparameter search, unchanged, under ``memprune run``: it exits 0, writes its own report
(and pickles its study with the guarded sampler in it), and every trial has a memprune record."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import optuna
import pytest

from optuna_memprune import records
from test_run_command import memprune_lines, run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rl_zoo3") is None,
                                reason="rl_zoo3 is not importable (the test extra installs rl-zoo3==2.9.2)")


def test_an_unchanged_rl_zoo3_search_gets_a_record_on_every_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'zoo.db'}"
    proc = run("--ram", "3GiB", "--", sys.executable, "-m", "rl_zoo3.train", "--algo", "dqn", "--env", "CartPole-v1",
               "-optimize", "--n-trials", "3", "--n-timesteps", "2000", "--n-jobs", "1", "--sampler", "random",
               "--pruner", "none", "--seed", "0", "--num-threads", "1", "--no-optim-plots", "-f", str(tmp_path),
               "--storage", url, "--study-name", "dqn-cartpole", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "dqn").glob("report_CartPole-v1_*.pkl"))) == 1  # rl-zoo3 pickled its study
    trials = optuna.load_study(study_name="dqn-cartpole", storage=url).get_trials(deepcopy=False)
    assert len(trials) == 3
    recs = [records.read(t.user_attrs) for t in trials]
    assert all(r is not None and r.peak_ram is not None and r.peak_ram <= 3 * 2**30 for r in recs), recs
    # the rl-zoo3 recipe predicted every trial before it ran, from the zoo's yml and the sampled params
    assert all(r.decision.value == "admitted" and r.pred_ram is not None for r in recs), [r.reason for r in recs]
    errors = sorted(abs(r.pred_ram - r.peak_ram) / r.peak_ram for r in recs)
    print("prediction errors:", [f"{e:.1%}" for e in errors])
    assert errors[1] < 0.25, errors  # the median; the accuracy bar itself is measured by a benchmark
    last = memprune_lines(proc.stderr)[-1]
    assert last.startswith("memprune: 3 trials guarded in study 'dqn-cartpole' (") and \
        last.endswith(f"memprune report {url} --study-name dqn-cartpole"), last
