"""scripts/bench_clients.py: its figures from hand-built trial records, and one real run of the plain torch
program unchanged under ``memprune run`` whose records the harness reads back."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from optuna_memprune.records import Decision, TrialRecord

MiB = 2**20
SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_clients.py"
_spec = importlib.util.spec_from_file_location("bench_clients", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_clients"] = bench  # dataclasses look their module up by name
_spec.loader.exec_module(bench)

SPACE = {"width": IntDistribution(32, 4096, log=True), "lr": FloatDistribution(1e-5, 1e-1, log=True)}
T0 = dt.datetime(2026, 1, 1)


def trial(
    number: int,
    record: TrialRecord | None,
    state: TrialState = TrialState.COMPLETE,
    seconds: float = 1.0,
    width: int = 64,
    lr: float = 1e-3,
) -> FrozenTrial:
    start = T0 + dt.timedelta(seconds=10 * number)
    return FrozenTrial(
        number=number,
        state=state,
        value=0.5 if state == TrialState.COMPLETE else None,
        datetime_start=start,
        datetime_complete=start + dt.timedelta(seconds=seconds) if state.is_finished() else None,
        params={"width": width, "lr": lr},
        distributions=SPACE,
        user_attrs=record.attrs() if record else {},
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def learned(center: int, bound: int) -> dict:
    return {"mode": "learned", "phase": "bound", "center": {"ram": center}, "bound": {"ram": bound}}


def test_score_counts_warmup_errors_bounds_launches_rejections_clamps_losses_and_waste() -> None:
    budget = 1000 * MiB
    trials = [
        trial(0, TrialRecord(Decision.UNCHECKED, peak_ram=300 * MiB, budget_ram=budget)),
        trial(1, TrialRecord(Decision.STOPPED, peak_ram=1001 * MiB, budget_ram=budget), TrialState.PRUNED, 4.0),
        trial(2, TrialRecord(Decision.UNCHECKED, peak_ram=500 * MiB, budget_ram=budget)),
        # predicted from here on: fit 10% under, bound 20% over a 500 MiB peak
        trial(
            3,
            TrialRecord(
                Decision.ADMITTED,
                pred_ram=450 * MiB,
                peak_ram=500 * MiB,
                budget_ram=budget,
                learned=learned(450 * MiB, 600 * MiB),
            ),
        ),
        trial(
            4,
            TrialRecord(
                Decision.REJECTED,
                pred_ram=2000 * MiB,
                budget_ram=budget,
                soft=0.9,
                learned=learned(1500 * MiB, 2000 * MiB),
            ),
            TrialState.PRUNED,
            width=4000,
        ),
        trial(
            5,
            TrialRecord(
                Decision.CLAMPED,
                pred_ram=880 * MiB,
                peak_ram=1100 * MiB,
                budget_ram=budget,
                clamped_from={"lr": 0.002},
                learned=learned(800 * MiB, 880 * MiB),
            ),
            TrialState.PRUNED,
            2.5,
        ),
        trial(
            6,
            TrialRecord(
                Decision.STOPPED,
                pred_ram=880 * MiB,
                peak_ram=1100 * MiB,
                budget_ram=budget,
                learned=learned(800 * MiB, 880 * MiB),
            ),
            TrialState.PRUNED,
            3.0,
        ),
        trial(7, None, TrialState.RUNNING),
    ]
    run = bench.Run("p", 1, budget, asked=8)
    rejected = bench.score(run, trials)
    assert run.trials == 8 and run.warmup == 3
    assert run.fit_errors == [pytest.approx(0.1)] and run.bound_over == [pytest.approx(0.2)]
    assert (run.launched_after, run.over_after) == (3, 1)  # 3, 5 and 6 launched; 6 stopped (5 clamped, not over)
    assert rejected == [(4, {"width": 4000, "lr": 1e-3}, 0.9 * budget)] and run.rejected == 1
    assert run.memoryless_clamps == 1  # trial 5 moved only the learning rate
    assert run.lost == 1  # trial 7 left RUNNING, no record
    assert run.wasted == pytest.approx(7.0)  # trials 1 and 6 ended over the budget
    assert run.decisions == {"unchecked": 2, "stopped": 2, "admitted": 1, "rejected": 1, "clamped": 1}


def test_a_first_predicted_trial_that_crossed_ends_the_warmup_and_counts_over() -> None:
    # Its record's decision is ``stopped``, but it was launched on a bound (its prediction is in the record):
    # counted by decision alone it stayed in the warm-up (2 here) and its crossing was never counted.
    budget = 1000 * MiB
    over = TrialRecord(Decision.STOPPED, pred_ram=900 * MiB, peak_ram=1001 * MiB, budget_ram=budget)
    fits = TrialRecord(Decision.ADMITTED, pred_ram=600 * MiB, peak_ram=500 * MiB, budget_ram=budget)
    run = bench.Run("p", 1, budget, asked=3)
    bench.score(
        run,
        [
            trial(0, TrialRecord(Decision.STOPPED, peak_ram=1001 * MiB, budget_ram=budget), TrialState.PRUNED),
            trial(1, over, TrialState.PRUNED),
            trial(2, fits),
        ],
    )
    assert run.warmup == 1 and (run.launched_after, run.over_after) == (2, 1)


def test_a_study_never_predicted_is_all_warmup_and_own_peaks_subtract_the_start() -> None:
    run = bench.Run("p", 2, 100 * MiB, asked=2)
    assert bench.score(run, [trial(i, TrialRecord(Decision.UNCHECKED, peak_ram=MiB)) for i in range(2)]) == []
    assert run.warmup == 2 and run.launched_after == 0 and run.fit_errors == []
    assert bench.own_peak(TrialRecord(Decision.UNCHECKED, peak_ram=5 * MiB)) == 5 * MiB
    incremental = argparse.Namespace(peak_ram=700 * MiB, start_ram=400 * MiB)  # the field being added
    assert bench.own_peak(incremental) == 300 * MiB


def test_in_a_shared_process_fit_and_bound_are_scored_as_admission_compares_them_and_on_the_increment() -> None:
    # the process at 400 MiB, the trial's own 300 MiB: fit 270 (10% under it), bound 330 (10% over it); as
    # admission compares them, 670 and 730 MiB against the process's 700 MiB peak
    run = bench.Run("p", 1, 1000 * MiB, asked=1)
    bench.score(
        run,
        [
            trial(
                0,
                TrialRecord(
                    Decision.ADMITTED,
                    pred_ram=270 * MiB,
                    peak_ram=700 * MiB,
                    start_ram=400 * MiB,
                    budget_ram=1000 * MiB,
                    learned=learned(270 * MiB, 330 * MiB),
                ),
            )
        ],
    )
    assert run.fit_errors_own == [pytest.approx(0.1)] and run.bound_over_own == [pytest.approx(0.1)]
    assert run.fit_errors == [pytest.approx(30 / 700)] and run.bound_over == [pytest.approx(30 / 700)]


def test_clients_line_aggregates_runs() -> None:
    a = bench.Run(
        "a",
        1,
        MiB,
        asked=3,
        trials=3,
        exit_code=0,
        unguarded_exit=0,
        warmup=4,
        fit_errors=[0.1, 0.3],
        bound_over=[0.2],
        launched_after=10,
        over_after=1,
        replayed=2,
        false_rejects=1,
        wasted=1.0,
        wasted_unguarded=3.0,
    )
    b = bench.Run(
        "b",
        2,
        MiB,
        asked=3,
        trials=5,
        exit_code=0,
        unguarded_exit=0,
        warmup=2,
        fit_errors=[0.2],
        bound_over=[0.4, 0.6],
        launched_after=10,
        lost=2,
        memoryless_clamps=1,
        wasted=1.0,
        wasted_unguarded=5.0,
        restarts_unguarded=12.0,  # its restarted programs' seconds to their first trials
    )
    totals = bench.Totals({"a", "b"}, [a, b])
    waste, own, line = totals.line().splitlines()
    # guarded 2 s against 8 s of killed trials and 12 s of restarts: 0.10 in all, 0.25 on the trials alone
    assert waste == (
        "CLIENTS_WASTE guarded=2.0s unguarded=20.0s (killed trials 8.0s, restarts 12.0s) trials_only_ratio=0.25"
    )
    assert own.startswith("CLIENTS_OWN fit_median_err=- bound_median_over=- ")
    assert line == (
        "CLIENTS programs=2 runs=2 trials_as_asked=1/2 warmup_max=4 fit_median_err=20.0% "
        "bound_median_over=40.0% over_budget_after_warmup=5.0% false_rejects=50.0% "
        "memoryless_clamps=1 lost=2 wasted_compute_ratio=0.10"
    )
    crashed = bench.Run("c", 1, MiB, asked=3, trials=3, exit_code=1, unguarded_exit=0)
    assert not crashed.as_asked


def test_restarts_count_to_their_first_trial_or_whole_when_they_made_none() -> None:
    t0 = dt.datetime(2026, 11, 29, 12, 0, 0)
    at = [t0 + dt.timedelta(seconds=s) for s in (0, 2, 10, 14, 30)]  # trial starts
    restarted = [t0 + dt.timedelta(seconds=s) for s in (7, 20, 25)]
    # 7 -> 10: 3 s; 20 -> none before the next restart at 25: 5 s whole; 25 -> 30: 5 s
    assert bench.restart_seconds(restarted, at, t0 + dt.timedelta(seconds=40)) == 13.0
    assert bench.restart_seconds([], at, t0) == 0.0


def test_a_budget_a_third_exceed_sits_in_the_widest_gap_not_in_a_bunch() -> None:
    # 30 peaks: 18 bunched at an import level (448-455), then 481, 483, 495 ... The gap at exactly a third
    # (481 -> 483) would put the budget within a reading's noise; 455 -> 481 (11 of 30 above) is the widest.
    peaks = [448] * 4 + [449] * 6 + [450, 450, 451, 451, 452, 452, 453, 453, 455, 481, 483, 495, 516, 534]
    peaks += [547, 564, 566, 676, 1241, 1851]
    budget = bench.third([p * MiB for p in peaks])
    assert budget == 468 * MiB and sum(p * MiB > budget for p in peaks) == 11
    # two clusters: the budget between them, a third above
    spread = [100 + i for i in range(20)] + [300 + i for i in range(10)]
    assert bench.third([p * MiB for p in spread]) == (119 + 300) * MiB // 2
    assert bench.third([MiB, 2 * MiB]) == 3 * MiB // 2  # no gap with 30-37% above: the one at a third


@pytest.mark.slow
def test_plain_torch_program_under_memprune_run_in_process_leaves_a_record_per_trial(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Two trials: both run unchecked in the learned footprint's warm-up (4 trials by default), as a third did.
    args = argparse.Namespace(trials=2, seed=0, logs=str(tmp_path))
    run = bench.Run("plain_torch", 1, 2048 * MiB, asked=2)
    url = bench.guarded(run, args, tmp_path, bench.has_storage_flag())
    log = (tmp_path / "plain_torch-1-guarded.log").read_text()
    assert run.exit_code == 0, log[-3000:]
    assert "memprune: guarding study" in log
    bench.score(run, bench.load_trials(url))
    assert run.trials == 2 and run.lost == 0 and run.as_asked
    assert sum(run.decisions.values()) == 2 and run.warmup >= 1  # the first trial cannot be predicted
