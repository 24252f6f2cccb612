"""The forecast stop in a real in-process guarded study: a trial whose RSS grows towards a budget it would
cross near its end is stopped early, PRUNED with its own decision and reason; a plateauing one completes.

Real pages against a budget set above the RSS of the fresh interpreter the study runs in; a real SQLite storage.
"""

from __future__ import annotations

import re
import subprocess
import sys

import _forecast_objectives as objectives
import optuna
from _forecast_objectives import STEPS
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.guard import Decision, read_record

MiB = 2**20
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_growing_trial_is_stopped_on_the_forecast_and_a_plateau_completes(tmp_path) -> None:
    # The study runs in a fresh interpreter: in a long test process the RSS the guard reads also moves with
    # what earlier tests left there (once a plateau trial was stopped on a rise of 1 MiB a step it did not make).
    url = f"sqlite:///{tmp_path / 'forecast.db'}"
    out = subprocess.run(
        [sys.executable, objectives.__file__, url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    budget = omp.Budget(ram=int(out.stdout.split()[-1]))
    study = optuna.load_study(study_name="forecast", storage=url)
    grown, flat = study.trials
    record = read_record(grown.user_attrs)
    assert grown.state is TrialState.PRUNED and record.decision is Decision.FORECAST_STOPPED
    assert re.match(
        r"stopped on the forecast: projected \d+\.\d\d [MG]iB at step 300 > \d+\.\d\d MiB; at step "
        r"\d+ now \(RSS .*\) \(in process\)$",
        record.reason,
    ), record.reason
    assert record.peak_ram < budget.ram  # stopped before it reached the line
    assert grown.last_step < STEPS // 2  # long before the end (it would have crossed near step 280)
    fc = record.forecast
    assert fc["horizon"] == STEPS and fc["limit"] == budget.ram and fc["step"] < STEPS // 2
    assert fc["projected"] > budget.ram and fc["elapsed_s"] > 0
    assert record.constraints()["memprune_ram"] > 0  # the projection, not the peak, counts: infeasible
    assert flat.state is TrialState.COMPLETE and read_record(flat.user_attrs).decision is Decision.ADMITTED
    assert flat.last_step == STEPS - 1 and read_record(flat.user_attrs).forecast == {}
    _the_report_has_the_forecast_stop(study, grown.number, budget.ram)


def _the_report_has_the_forecast_stop(study: optuna.Study, number: int, limit: int) -> None:
    """The report of that study: the stop is its own row (table, JSON, HTML) and its plot is drawn."""
    from rich.console import Console

    from optuna_memprune import report

    data = report.build(study)
    assert data.counts["forecast_stopped"] == 1 and [t.number for t in data.notable] == [number]
    (row,) = data.to_json_dict()["forecast_stops"]
    assert row["number"] == number and row["horizon"] == STEPS and row["limit"] == limit
    assert row["step"] < row["horizon"] and row["end_s"] > row["elapsed_s"] > 0
    console = Console(width=160, record=True)
    console.print(report.render_table(data))
    text = console.export_text()
    assert "forecast stops" in text and f"{row['step']:,}" in text and "forecast_stopped" in text
    page = report.render_html(data)
    assert '<section id="forecast-stops">' in page and 'id="plot-forecast"' in page
    assert f'id="forecast-observed-{number}"' in page and f'id="forecast-projected-{number}"' in page


def test_the_runner_stops_a_growing_child_on_the_forecast_of_its_n_timesteps(tmp_path) -> None:
    from optuna_memprune.ledger import HostBudget, Ledger

    guard = omp.MemoryGuard(
        objectives.footprint,
        omp.Budget(ram="700MiB"),
        monitor_interval=0.02,
        search_space={"n_timesteps": CategoricalDistribution([400])},
    )  # horizon: the param
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )
    ledger = Ledger(
        HostBudget(ram="8GiB", headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )
    omp.optimize(study, objectives.grow_steps, guard=guard, n_trials=1, host=ledger, enforce="polling")
    (trial,) = study.trials
    record = read_record(trial.user_attrs)
    assert trial.state is TrialState.PRUNED and record.decision is Decision.FORECAST_STOPPED, record.reason
    assert re.match(
        r"stopped on the forecast: projected \d+\.\d\d [MG]iB at step 400 > 700\.00 MiB; at step \d+ "
        r"now \(RSS .*\) \(by the runner\)$",
        record.reason,
    ), record.reason
    assert record.peak_ram < 700 * MiB and record.forecast["step"] < 200  # it would cross near step 320
    assert ledger.entries() == []
