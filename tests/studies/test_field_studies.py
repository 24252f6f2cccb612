"""The studies from the field run end to end in smoke mode, record every trial, and decide nothing wrongly.

Each study runs as a script (its own process, as a user runs it) against a SQLite file; the test then reads
the stored trials: all finished, each with a record, the decisions the study exists to show, no admitted
or clamped trial over its budget, no rejected trial predicted under the soft line, and `memprune report`
reads the study.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from optuna_memprune import read_record
from optuna_memprune.cli import main
from optuna_memprune.guard import Decision

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ("ram", "vram", "threads")
# The calibration recheck is tests/estimate/test_recheck.py's subject (with real study processes); in a study
# here it would add a probe to the first footprint once the suite's cache is 10 minutes old, or, reading a
# baseline under the suite's load, recalibrate and make the study measure its stacks and envs again.
NO_RECHECK = {"MEMPRUNE_RECHECK": "0"}


def _buffer_never_ran_at_1e6(trials):
    ran = [t for t in trials if read_record(t.user_attrs).decision is not Decision.REJECTED]
    assert all(t.params["buffer_size"] < 1_000_000 for t in ran), [t.params for t in ran]


def _deque_and_ring_decided_apart(trials):
    def decision(kind):
        return next(
            read_record(t.user_attrs).decision
            for t in trials
            if t.params.get("buffer_kind") == kind and t.params.get("buffer_size") == 1_000_000
        )

    assert decision("deque") is Decision.REJECTED
    assert decision("numpy") is Decision.ADMITTED
    assert any(t.params["buffer_kind"] == "deque" and t.state is optuna.trial.TrialState.COMPLETE for t in trials)


def _threads_as_predicted(trials):
    for t in trials:
        r = read_record(t.user_attrs)
        if t.state is optuna.trial.TrialState.COMPLETE:
            assert abs(r.peak_threads - r.pred_threads) <= 2, (t.number, r.pred_threads, r.peak_threads)


def _vram_predicted_only_without_gpu(trials):
    import torch

    for t in trials:
        r = read_record(t.user_attrs)
        assert r.pred_vram and r.pred_vram > 0
        if not torch.cuda.is_available():
            assert r.peak_vram is None


# study -> (launch decisions that must occur, a study-specific check)
STUDIES = {
    "sb3_dqn_atari": ({"rejected", "clamped"}, _buffer_never_ran_at_1e6),
    "ppo_pixels": ({"clamped"}, None),
    "ppo_threads": ({"rejected", "clamped"}, _threads_as_predicted),
    "qnet_gpu": ({"rejected", "admitted"}, _vram_predicted_only_without_gpu),
    "dqn_deque": ({"rejected", "admitted"}, _deque_and_ring_decided_apart),
}


def _launch(record) -> str:
    if record.decision in (Decision.REJECTED, Decision.UNCHECKED):
        return record.decision.value
    return "clamped" if record.clamped_from else "admitted"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STUDIES))
def test_study_smoke_runs_guarded_and_decides_nothing_wrongly(name, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / (name + '.db')}"
    out = subprocess.run(
        [sys.executable, str(ROOT / "studies" / f"{name}.py"), "--smoke", "--storage", url],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **NO_RECHECK},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(f"STUDY {name} ") and " wrong=0 " in last, out.stdout[-3000:]

    trials = optuna.load_study(study_name=name, storage=url).trials
    assert trials
    launches = set()
    budgets = None
    for t in trials:
        assert t.state.is_finished(), f"#{t.number} left {t.state.name}"
        r = read_record(t.user_attrs)
        assert r is not None, f"#{t.number} has no record"
        launches.add(_launch(r))
        budgets = budgets or {k: getattr(r, f"budget_{k}") for k in RESOURCES}
        assert {k: getattr(r, f"budget_{k}") for k in RESOURCES} == budgets
        if r.decision is Decision.REJECTED:
            assert t.state is optuna.trial.TrialState.PRUNED and r.peak_ram is None
            assert any(b is not None and (getattr(r, f"pred_{k}") or 0) > r.soft * b for k, b in budgets.items()), (
                f"#{t.number} rejected with {r.pred_ram=} {r.pred_vram=} {r.pred_threads=} under {budgets}"
            )
            continue
        assert r.peak_ram is not None, f"#{t.number} ran without a RAM reading"
        # A trial checked before launch must not cross its budget: the guard would have stopped it.
        assert r.decision is not Decision.STOPPED or r.pred_ram is None, (t.number, r.reason)
        for k, b in budgets.items():
            peak = getattr(r, f"peak_{k}")
            assert b is None or peak is None or peak <= b, f"#{t.number} {k} peak {peak} over budget {b}"
    expected, check = STUDIES[name]
    assert expected <= launches, f"{name}: expected decisions {expected}, saw {launches}"
    assert any(t.state is optuna.trial.TrialState.COMPLETE for t in trials), "no trial trained to the end"
    if check is not None:
        check(trials)

    # ``memprune report`` reads the study (its CLI's main, in this process: the study's own process is the one
    # that matters here).
    assert main(["report", url, "--study", name, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["study"]["name"] == name and data["study"]["n_trials"] == len(trials)
