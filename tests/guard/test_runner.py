"""The process-per-trial runner with real child processes, real allocations and a real SQLite storage."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.ledger import HostBudget, Ledger

import _runner_objectives as objectives

HERE = Path(__file__).parent
MiB = 2**20
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path: Path, guard: omp.MemoryGuard, name: str = "s", **kw) -> optuna.Study:
    return optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name=name,
        load_if_exists=True,
        sampler=guard.wrap_sampler(kw.pop("sampler", optuna.samplers.RandomSampler(seed=0))),
        pruner=guard.wrap_pruner(None),
        **kw,
    )


def _ledger(tmp_path: Path, ram: str = "8GiB", host: str = "test-host", **kw) -> Ledger:
    return Ledger(
        HostBudget(ram=ram, gpus=kw.pop("gpus", None), headroom=0.0, **kw),
        url=f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        host=host,
    )


def _space(high: int = 64) -> dict:
    return {"mb": optuna.distributions.IntDistribution(8, high)}


def _record(trial: optuna.trial.FrozenTrial) -> omp.guard.TrialRecord:
    record = omp.read_record(trial.user_attrs)
    assert record is not None, f"trial {trial.number} has no record"
    return record


def test_a_child_over_its_budget_is_stopped_pruned_with_the_reading_and_the_next_trial_runs(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="700MiB"), search_space=_space(16))
    study = _study(tmp_path, guard)
    ledger = _ledger(tmp_path)
    omp.optimize(study, objectives.grow, guard=guard, n_trials=1, host=ledger, enforce="polling")  # the watchdog's stop
    omp.optimize(study, objectives.hold, guard=guard, n_trials=1, host=ledger)
    stopped, after = study.trials
    record = _record(stopped)
    assert stopped.state is TrialState.PRUNED and record.decision.value == "stopped"
    assert "over the budget" in record.reason and record.breach["rss"] > 700 * MiB
    assert record.peak_ram >= 700 * MiB and record.peak_ram < 2000 * MiB  # stopped long before its 4 GiB
    assert 0 <= record.breach["stop_ms"] < 1000
    assert record.constraints()["memprune_ram"] > 0  # the sampler learns this region is infeasible
    assert after.state is TrialState.COMPLETE and _record(after).decision.value == "admitted"
    assert ledger.entries() == []


def test_soft_line_makes_should_prune_answer_true_in_the_child(tmp_path: Path) -> None:
    # the child's baseline (100-200 MiB) + mb + 450 MiB crosses the soft line (400 MiB), not the budget
    guard = omp.MemoryGuard(
        functools.partial(objectives.footprint, base=100), omp.Budget(ram="800MiB"), search_space=_space(16), soft=0.5
    )
    study = _study(tmp_path, guard)
    omp.optimize(study, objectives.grow_to_soft, guard=guard, n_trials=1, host=_ledger(tmp_path))
    (trial,) = study.trials
    record = _record(trial)
    assert trial.state is TrialState.PRUNED, record.reason
    assert record.decision.value == "soft_pruned" and "soft line" in record.reason
    assert 400 * MiB < record.breach["rss"] < 800 * MiB and record.peak_ram < 800 * MiB


def test_rejected_and_clamped_trials_store_what_ran(tmp_path: Path) -> None:
    space = {"mb": optuna.distributions.IntDistribution(8, 512)}
    budget = omp.Budget(ram="600MiB")  # soft line 540 MiB: mb <= 280 fits
    for policy in ("reject", "clamp"):
        guard = omp.MemoryGuard(objectives.footprint, budget, search_space=space, on_infeasible=policy)
        study = _study(tmp_path, guard, name=policy, sampler=optuna.samplers.RandomSampler(seed=3))
        omp.optimize(
            study,
            functools.partial(objectives.hold, seconds=0.0),
            guard=guard,
            n_trials=8,
            n_jobs=2,
            host=_ledger(tmp_path),
        )
        decisions = [_record(t).decision.value for t in study.trials]
        assert all(t.state.is_finished() for t in study.trials)
        for t in study.trials:
            record = _record(t)
            if record.decision.value == "rejected":
                assert t.state is TrialState.PRUNED and "ran_mb" not in t.user_attrs
                assert t.params["mb"] > 280 and record.pred_ram > 0.9 * budget.ram
            else:
                assert t.state is TrialState.COMPLETE and t.user_attrs["ran_mb"] == t.params["mb"] <= 280
                assert record.peak_ram < budget.ram and record.host == "test-host"
            if record.decision.value == "clamped":
                assert record.clamped_from["mb"] > 280
        assert ("rejected" in decisions) == (policy == "reject")
        assert ("clamped" in decisions) == (policy == "clamp")


def test_a_study_made_with_a_plain_sampler_is_checked_and_keeps_its_sampler(tmp_path: Path) -> None:
    # as a newcomer writes it: create_study() with its default sampler, the guard passed to optimize only
    space = {"mb": optuna.distributions.IntDistribution(8, 512)}
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="600MiB"), search_space=space)
    sampler = optuna.samplers.RandomSampler(seed=3)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", sampler=sampler)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="study.sampler is not guard.wrap_sampler")
        omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=6,
                     host=_ledger(tmp_path))  # fmt: skip
    decisions = {_record(t).decision.value for t in study.trials}
    assert "unchecked" not in decisions and decisions <= {"admitted", "clamped", "rejected"}, decisions
    assert all(t.params["mb"] <= 280 for t in study.trials if t.state is TrialState.COMPLETE)
    assert study.sampler is sampler  # put back: the study is as it was made


def test_a_child_killed_from_outside_ends_fail_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "pid"
    monkeypatch.setenv("MEMPRUNE_TEST_MARKER", str(marker))
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)

    def kill_when_ready() -> None:
        for _ in range(600):
            if marker.exists():
                os.kill(int(marker.read_text()), signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_ready)
    killer.start()
    omp.optimize(study, objectives.wait_to_be_killed, guard=guard, n_trials=1, host=_ledger(tmp_path))
    killer.join()
    omp.optimize(study, objectives.crash, guard=guard, n_trials=1, host=_ledger(tmp_path))
    killed, crashed = study.trials
    assert killed.state is TrialState.FAIL and "SIGKILL" in _record(killed).reason
    assert "OOM killer" in _record(killed).reason
    assert crashed.state is TrialState.FAIL and "SIGSEGV" in _record(crashed).reason
    assert "constraints:memprune_ram" in killed.system_attrs


def test_an_objective_error_fails_the_trial_and_is_raised_unless_caught(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    seen = []
    omp.optimize(
        study,
        objectives.raise_value_error,
        guard=guard,
        n_trials=2,
        catch=(ValueError,),
        callbacks=[lambda s, t: seen.append(t)],
        host=_ledger(tmp_path),
    )
    # each callback gets the trial as it ended: its final state and its record
    assert [t.state for t in seen] == [TrialState.FAIL, TrialState.FAIL]
    assert all("ValueError: bad config" in _record(t).reason for t in seen)
    with pytest.raises(ValueError, match="bad config"):
        omp.optimize(study, objectives.raise_value_error, guard=guard, n_trials=3, host=_ledger(tmp_path))
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3
    assert "ValueError: bad config" in _record(study.trials[-1]).reason


def test_bad_input_is_refused_before_any_trial_and_nothing_is_left_running(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    with pytest.raises(ValueError, match="in-memory"):
        omp.optimize(optuna.create_study(), objectives.hold, guard=guard, n_trials=1)
    with pytest.raises(
        ValueError, match=r"n_jobs must be a positive int or -1 \(this machine's CPU count\), but got 0"
    ):
        omp.optimize(_study(tmp_path, guard), objectives.hold, guard=guard, n_jobs=0)
    with pytest.raises(TypeError, match="got both n_jobs= and n_workers=, its old name: give n_jobs= only"):
        omp.optimize(_study(tmp_path, guard), objectives.hold, guard=guard, n_jobs=2, n_workers=2)
    study = _study(tmp_path, guard)
    with pytest.raises(TypeError, match="picklable"):
        omp.optimize(study, lambda t: 1.0, guard=guard, n_trials=1, host=_ledger(tmp_path))
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    assert "could not be started" in _record(study.trials[0]).reason


def test_the_host_ledger_admits_only_what_fits_and_margins_tighten(tmp_path: Path) -> None:
    # Each trial reserves about (260 + mb) MiB x margin; the host holds about 2 of them at once.
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space(32))
    study = _study(tmp_path, guard)
    ledger = _ledger(tmp_path, ram="900MiB")
    omp.optimize(
        study, functools.partial(objectives.hold, seconds=0.4), guard=guard, n_trials=10, n_jobs=4, host=ledger
    )
    trials = study.trials
    assert all(t.state is TrialState.COMPLETE for t in trials)
    spans = [t.user_attrs["t_run"] for t in trials]
    reserve = {t.number: min(_record(t).pred_ram * _record(t).margin["ram"], _record(t).budget_ram) for t in trials}
    for t in trials:  # at every child's start, the reservations of the children running then fit
        start = t.user_attrs["t_run"][0]
        running = [u for u in trials if u.user_attrs["t_run"][0] <= start <= u.user_attrs["t_run"][1]]
        assert sum(reserve[u.number] for u in running) <= ledger.capacity.ram
    assert max(sum(1 for s in spans if s[0] <= x[0] <= s[1]) for x in spans) >= 2  # it did run in parallel
    margins = [_record(t).margin["ram"] for t in trials]
    assert margins[0] == 1.25 and margins[-1] < 1.25  # over-predicting footprint: the margin tightens
    assert ledger.entries() == []


def test_a_worker_killed_mid_trial_leaves_no_running_trial_and_no_reservation(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    storage, ledger_url = f"sqlite:///{tmp_path / 'study.db'}", f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    cmd = [
        sys.executable,
        "-m",
        "optuna_memprune.cli",
        "worker",
        "_runner_objectives:wait_to_be_killed",
        "--storage",
        storage,
        "--study",
        "s",
        "--footprint",
        "_runner_objectives:footprint",
        "--ram",
        "1GiB",
        "--n-trials",
        "1",
        "--host-id",
        "test-host",
        "--ledger",
        ledger_url,
        "--host-ram",
        "4GiB",
        "--no-progress",
    ]
    worker = subprocess.Popen(cmd, cwd=HERE, env={**os.environ, "MEMPRUNE_TEST_MARKER": str(marker)})
    try:
        for _ in range(1200):
            if marker.exists() or worker.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the worker's trial never started"
        child = int(marker.read_text())
        worker.kill()
        worker.wait()
        for _ in range(100):  # the trial's process dies with its runner
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the trial's process outlived its runner")
    finally:
        worker.kill()
    ledger = Ledger(HostBudget(ram="4GiB", gpus=None), url=ledger_url, host="test-host")
    assert len(ledger.entries()) == 1  # not reaped yet: nothing has looked
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"))
    study = _study(tmp_path, guard)
    assert [t.state for t in study.trials] == [TrialState.RUNNING]
    omp.optimize(study, objectives.hold, guard=guard, n_trials=1, host=ledger)
    dead, fresh = study.trials
    assert dead.state is TrialState.FAIL and "died while the trial ran" in _record(dead).reason
    assert fresh.state is TrialState.COMPLETE
    assert ledger.entries() == []


def test_gpu_placement_sets_cuda_visible_devices(tmp_path: Path, capsys) -> None:
    # Declared GPUs (no real one is needed to place a trial): the child sees the index it was given.
    def footprint(params: dict) -> omp.Footprint:
        return objectives.footprint(params) + omp.Footprint.of(vram=3 * 2**30)

    guard = omp.MemoryGuard(footprint, omp.Budget(ram="1GiB", vram="6GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    ledger = _ledger(tmp_path, gpus=["2GiB", "8GiB"])
    omp.optimize(
        study,
        functools.partial(objectives.hold, seconds=0.0),
        guard=guard,
        n_trials=2,
        host=ledger,
        show_progress_bar=True,
    )
    for t in study.trials:
        assert _record(t).gpu == 1 and t.user_attrs["cuda_visible"] == "1"
    bar = capsys.readouterr().err  # the progress line, on stderr
    assert "done 2" in bar and "failed 0" in bar


def test_study_stop_from_a_callback_or_the_objective_ends_the_run(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    omp.optimize(
        study,
        functools.partial(objectives.hold, seconds=0.0),
        guard=guard,
        n_trials=10,
        callbacks=[lambda s, t: s.stop() if t.number == 1 else None],
        host=_ledger(tmp_path),
    )
    assert len(study.trials) == 2
    omp.optimize(study, objectives.stop_study, guard=guard, n_trials=10, host=_ledger(tmp_path))
    assert len(study.trials) == 3 and study.trials[-1].state is TrialState.COMPLETE


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["nowhere:objective", "--footprint", "_runner_objectives:footprint", "--ram", "1GiB"],
            1,
            "the objective 'nowhere:objective' could not be loaded",
        ),
        (["_runner_objectives:hold", "--footprint", "_runner_objectives:footprint", "--ram", "lots"], 2, "lots"),
        (["_runner_objectives:hold"], 2, "give the guard"),
        (
            [
                "_runner_objectives:hold",
                "--footprint",
                "_runner_objectives:footprint",
                "--ram",
                "1GiB",
                "--storage",
                "nosuchdb://x",
            ],
            1,
            "could not open study 's' in nosuchdb://x",
        ),
    ],
)
def test_worker_cli_bad_input_is_one_line_exit_1_at_run_time_and_2_for_usage(
    tmp_path: Path, args: list, code: int, message: str
) -> None:
    storage = ["--storage", f"sqlite:///{tmp_path / 's.db'}"] if "--storage" not in args else []
    proc = subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "worker", *args, *storage, "--study", "s"],
        cwd=HERE,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == code and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_a_reservation_is_capped_at_the_per_trial_budget(tmp_path: Path) -> None:
    # The footprint leaves out the child's baseline and 3/4 of its block: observed / predicted is 6-50, so
    # the learned margin is large, but the watchdog stops any tree at its budget: no reservation is larger.
    guard = omp.MemoryGuard(
        lambda p: omp.Footprint.of(ram=p["mb"] * MiB // 4), omp.Budget(ram="900MiB"), search_space=_space(256)
    )  # a trial's process is forked: it starts at what the test process holds (257 MiB in a suite run, not 74)
    study = _study(tmp_path, guard)
    for mb in [8] * 5 + [200] * 2:  # small trials teach a margin of about 50; 50 x 50 MiB > the host
        study.enqueue_trial({"mb": mb})
    omp.optimize(
        study,
        functools.partial(objectives.hold, seconds=0.0),
        guard=guard,
        n_trials=7,
        host=_ledger(tmp_path, ram="1000MiB"),
    )
    records = [_record(t) for t in study.trials]
    assert all(t.state is TrialState.COMPLETE for t in study.trials), [r.reason for r in records]
    over_host = [r for r in records if r.margin and r.pred_ram * r.margin["ram"] > 1000 * MiB]
    assert over_host, [(r.pred_ram >> 20, r.margin) for r in records]  # uncapped, these could never start


def test_a_heavy_library_this_process_loaded_is_imported_once_by_the_fork_server(tmp_path: Path) -> None:
    # the trial's process finds it imported (a program's TensorFlow or Lightning, not paid again per trial)
    import pandas  # noqa: F401 - loaded here, as a user's program has its libraries loaded

    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    omp.optimize(study, objectives.found_pandas, guard=guard, n_trials=1, host=_ledger(tmp_path))
    assert study.trials[0].value == 1.0


def test_nothing_is_left_running_in_this_process_after_optimize(tmp_path: Path) -> None:
    import psutil

    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    omp.optimize(
        _study(tmp_path, guard),
        functools.partial(objectives.hold, seconds=0.0),
        guard=guard,
        n_trials=2,
        host=_ledger(tmp_path),
    )
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    # multiprocessing's resource tracker (a few MiB) stays, as for any multiprocessing user; the fork
    # server (torch and the objective's module imported) and the trials' processes do not
    assert all("resource_tracker" in " ".join(p.cmdline()) for p in left), [p.cmdline() for p in left]


def test_the_fork_server_ends_after_the_exit_handlers_without_tearing_its_modules_down(tmp_path: Path) -> None:
    # A program whose objective's module the server preloads; the module notes how each process ended.
    notes = tmp_path / "notes"
    notes.mkdir()
    here = Path(objectives.__file__).parent
    out = subprocess.run(
        [sys.executable, "_server_exit_objective.py", f"sqlite:///{tmp_path / 's.db'}"],
        cwd=here,
        env={**os.environ, "MEMPRUNE_TEST_NOTES": str(notes)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pid, states = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert states == "['COMPLETE', 'COMPLETE']"
    seen = sorted(name.split("-")[0] for name in os.listdir(notes) if name.split("-")[1] != pid)
    # one process besides the program imported the module, the server: it ran its exit handlers (the
    # libraries' own) and then ended without tearing its modules down (about 1 s of CPU with torch preloaded,
    # which optimize waited for); the trials' processes, forked from it, end with os._exit as
    # multiprocessing's children do
    assert seen == ["atexit"], sorted(os.listdir(notes))


def test_the_old_argument_names_still_run_with_a_warning_naming_optunas(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    with pytest.warns(FutureWarning) as caught:
        omp.optimize(
            study,
            functools.partial(objectives.hold, seconds=0.0),
            guard=guard,
            n_trials=2,
            n_workers=2,
            progress=False,
            host=_ledger(tmp_path),
        )
    assert sorted(str(w.message) for w in caught) == [
        "optimize(n_workers=) is renamed n_jobs= (Optuna's name); n_workers= goes in the next release.",
        "optimize(progress=) is renamed show_progress_bar= (Optuna's name); progress= goes in the next release.",
    ]
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
