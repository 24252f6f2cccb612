"""The forecast stop in a real in-process guarded study: a trial whose RSS grows towards a budget it would
cross near its end is stopped early, PRUNED with its own decision and reason; a plateauing one completes.

Real numpy allocations against a budget set above this process's present RSS; a real SQLite storage.
"""

from __future__ import annotations

import mmap
import re
import time

import optuna
import psutil
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.guard import Decision, read_record
from optuna_memprune.guard._start import give_back

MiB = 2**20
STEPS = 300
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _block(size: int) -> mmap.mmap:
    """``size`` bytes of fresh anonymous memory, every page written: the RSS grows by ``size`` whatever the
    heap of this process (a long test run) holds free."""
    block = mmap.mmap(-1, size)
    block.write(b"\1" * size)
    return block


def _objective(trial: optuna.Trial) -> float:
    """``grow``: 1 MiB more every step (300 MiB at step 300); ``plateau``: 200 MiB in the first 15 steps (a
    ring buffer filling), then flat. Reports every step."""
    kind = trial.suggest_categorical("kind", ["grow", "plateau"])
    held = []
    for step in range(STEPS):
        if kind == "grow" or step < 15:
            held.append(_block(MiB if kind == "grow" else 200 * MiB // 15))
        time.sleep(0.01)
        trial.report(float(len(held)), step)
    return float(len(held))


def test_a_growing_trial_is_stopped_on_the_forecast_and_a_plateau_completes(tmp_path) -> None:
    # The process as the guard finds it: the first trial's start collects garbage and trims the heap, which
    # after a long test run gave back enough that the growing trial never reached a budget set from the RSS
    # before it (it completed).
    give_back()
    base = psutil.Process().memory_info().rss
    budget = omp.Budget(ram=base + 280 * MiB)  # the growing trial would cross it at about step 280 of 300
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=base),
        budget,
        horizon=STEPS,
        monitor_interval=0.02,
        search_space={"kind": CategoricalDistribution(["grow", "plateau"])},
    )
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'forecast.db'}", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler())
    )
    study.enqueue_trial({"kind": "grow"})
    study.enqueue_trial({"kind": "plateau"})
    study.optimize(guard.wrap_objective(_objective), n_trials=2)
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
    import _forecast_objectives as objectives

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
