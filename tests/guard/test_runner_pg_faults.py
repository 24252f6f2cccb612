"""The process-per-trial runner on a PostgreSQL server: it rides out a restart of the server that holds its
study and its host ledger (no exception leaves optimize(), every trial ends with its record), and a trial
waiting for its reservation does not keep trying the ledger 20 times a second, a dead runner's trial that
another runner of its host is failing keeps one reason, and a trial's process killed while it starts fails
that trial only."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest

import optuna_memprune as omp
from optuna_memprune import records
from optuna_memprune.ledger import HostCapacity, Ledger, Request

sys.path.insert(0, str(Path(__file__).parent))
from _runner_objectives import fixed_footprint, nap, nap_with  # noqa: E402

MiB = 2**20
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_optimize_rides_out_a_postgresql_restart(postgres_cluster) -> None:
    url = postgres_cluster.url()
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="400MiB"))
    study = optuna.create_study(
        storage=url,
        study_name="restart",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(),
    )
    ledger = Ledger(HostCapacity(ram=500 * MiB), url=url, host="h")  # one 300 MiB trial at a time: one waits

    def restart() -> None:
        time.sleep(2.5)
        postgres_cluster.stop("fast")
        time.sleep(4.0)  # longer than the 3.1 s the runner's storage retries used to wait in all
        postgres_cluster.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        omp.optimize(study, nap, guard=guard, host=ledger, n_trials=8, n_jobs=2, show_progress_bar=False)
    finally:
        restarter.join()
    trials = optuna.load_study(storage=url, study_name="restart").trials
    assert len(trials) == 8
    assert all(t.state.is_finished() for t in trials), [t.state for t in trials]
    records = [omp.read_record(t.user_attrs) for t in trials]
    assert all(r is not None and r.reason for r in records), [t.user_attrs for t in trials]
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in trials[-2:])  # the study went on after it
    assert ledger.entries() == []


class CountingLedger(Ledger):
    """A real ledger that counts the runner's admission attempts."""

    tries = 0

    def try_admit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        CountingLedger.tries += 1
        return super().try_admit(*args, **kwargs)


def test_a_waiting_trial_tries_a_full_postgresql_ledger_a_few_times_a_second_not_twenty(postgres_url: str) -> None:
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="400MiB"))
    study = optuna.create_study(
        storage=postgres_url, study_name="pace", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
    )
    ledger = CountingLedger(HostCapacity(ram=500 * MiB), url=postgres_url, host="h")
    owner = subprocess.Popen(["sleep", "60"])  # a live process whose reservation fills the host
    try:
        assert ledger.try_admit(Request(ram=500 * MiB), "other", owner_pid=owner.pid) is not None
        threading.Timer(4.0, owner.kill).start()  # then its entry is reaped and the trial admitted
        CountingLedger.tries = 0
        omp.optimize(study, nap, guard=guard, host=ledger, n_trials=1, show_progress_bar=False)
    finally:
        owner.kill()
        owner.wait()
    assert study.trials[0].state is optuna.trial.TrialState.COMPLETE
    # 4 s of waiting: 10 tries in the first half second, then one every 0.25-0.75 s (at most 14 more);
    # every 50 ms it was about 80, which with 48 waiting runners kept two cores busy
    assert 2 <= CountingLedger.tries <= 30, CountingLedger.tries


def _killed_worker(url: str, tmp_path: Path) -> int:
    """A `memprune worker` of study "s" on host "h" (study and ledger in ``url``), SIGKILLed mid-trial; its pid."""
    marker = tmp_path / "pid"
    cmd = [
        sys.executable,
        "-m",
        "optuna_memprune.cli",
        "worker",
        "_runner_objectives:wait_to_be_killed",
        "--storage",
        url,
        "--study",
        "s",
        "--footprint",
        "_runner_objectives:footprint",
        "--ram",
        "1GiB",
        "--n-trials",
        "1",
        "--host-id",
        "h",
        "--ledger",
        url,
        "--host-ram",
        "4GiB",
        "--no-progress",
    ]
    worker = subprocess.Popen(cmd, cwd=Path(__file__).parent, env={**os.environ, "MEMPRUNE_TEST_MARKER": str(marker)})
    try:
        for _ in range(1200):
            if marker.exists() or worker.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the worker's trial never started"
    finally:
        worker.kill()
        worker.wait()
    return worker.pid


def _second_runner(url: str, ledger: Ledger) -> None:
    """A runner of study "s" on host "h" that runs no trial: it only ends the trials of dead runners."""
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="400MiB"))
    study = optuna.load_study(storage=url, study_name="s", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
    omp.optimize(study, nap, guard=guard, host=ledger, n_trials=0, show_progress_bar=False)


def test_a_dead_runners_trial_already_being_failed_by_another_runner_keeps_one_reason(
    postgres_url: str, tmp_path: Path
) -> None:
    pid = _killed_worker(postgres_url, tmp_path)
    ledger = Ledger(HostCapacity(ram=4 * 2**30), url=postgres_url, host="h")
    # another runner of the host got there first: it reaped the entry and wrote the record, and has not yet
    # failed the trial (two runners of one host read the same reaped entry in the drill)
    reaped = ledger.reap()
    assert len(reaped) == 1
    study = optuna.load_study(storage=postgres_url, study_name="s")
    (trial,) = study.trials
    first = f"its runner (pid {pid} on host h) died while the trial ran; reaped by pid {os.getpid()}"
    records.write_frozen(study, trial._trial_id, records.TrialRecord(decision=records.Decision.ADMITTED, reason=first))
    _second_runner(postgres_url, ledger)
    (trial,) = optuna.load_study(storage=postgres_url, study_name="s").trials
    assert trial.state is optuna.trial.TrialState.FAIL
    assert omp.read_record(trial.user_attrs).reason == first  # was "<first>; then its runner ... died ..." twice
    assert ledger.reaped() == [] and ledger.entries() == []


def test_a_trial_process_killed_while_it_reads_its_payload_fails_that_trial_only(postgres_url: str) -> None:
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="1GiB"))
    study = optuna.create_study(
        storage=postgres_url, study_name="started", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
    )
    objective = functools.partial(nap_with, ballast=bytes(128 * MiB))  # read from a pipe: it takes a while
    killed: list[int] = []

    def kill_the_first_trial_process() -> None:  # as the kernel's OOM killer may, at any moment
        me = psutil.Process()
        storage = optuna.storages.RDBStorage(postgres_url)
        study_id = storage.get_study_id_from_name("started")
        while not storage.get_all_trials(study_id, deepcopy=False):  # the fork server's warm-up process is no trial's
            time.sleep(0.001)
        for _ in range(60_000):
            for server in me.children():
                try:
                    if "forkserver" in " ".join(server.cmdline()):
                        for child in server.children():
                            child.kill()
                            killed.append(child.pid)
                            return
                except psutil.Error:
                    pass
            time.sleep(0.001)

    killer = threading.Thread(target=kill_the_first_trial_process, daemon=True)
    killer.start()
    omp.optimize(
        study,
        objective,
        guard=guard,
        host=Ledger(HostCapacity(ram=2 * 2**30), url=postgres_url, host="h"),
        n_trials=2,
        show_progress_bar=False,
    )  # raised BrokenPipeError before
    killer.join(5)
    assert killed
    first, second = optuna.load_study(storage=postgres_url, study_name="started").trials
    assert first.state is optuna.trial.TrialState.FAIL
    assert "could not be started in its own process" in omp.read_record(first.user_attrs).reason
    assert second.state is optuna.trial.TrialState.COMPLETE


def test_a_trial_reaped_by_another_live_runner_is_left_to_it(postgres_url: str, tmp_path: Path) -> None:
    _killed_worker(postgres_url, tmp_path)
    reap = (
        "import sys, time; from optuna_memprune.ledger import HostCapacity, Ledger; "
        "print(len(Ledger(HostCapacity(ram=1), url=sys.argv[1], host='h').reap()), flush=True); time.sleep(120)"
    )
    reaper = subprocess.Popen([sys.executable, "-c", reap, postgres_url], stdout=subprocess.PIPE, text=True)
    try:
        assert reaper.stdout.readline().strip() == "1"  # it reaped the dead worker's entry and runs on
        ledger = Ledger(HostCapacity(ram=4 * 2**30), url=postgres_url, host="h")
        _second_runner(postgres_url, ledger)  # left to the reaper: two runners failing one trial interleave
        (trial,) = optuna.load_study(storage=postgres_url, study_name="s").trials
        assert trial.state is optuna.trial.TrialState.RUNNING and len(ledger.reaped()) == 1
    finally:
        reaper.kill()
        reaper.wait()
    _second_runner(postgres_url, ledger)  # the reaper is gone: this runner ends the trial
    (trial,) = optuna.load_study(storage=postgres_url, study_name="s").trials
    assert trial.state is optuna.trial.TrialState.FAIL
    assert "died while the trial ran" in omp.read_record(trial.user_attrs).reason
    assert ledger.reaped() == []


class StopsTheServerOnce(optuna.samplers.RandomSampler):
    """A real sampler that stops the PostgreSQL server in the middle of the first trial's check (between
    the ask and the guard's lookahead, which reads the study's trials) and starts it again 3 s later."""

    def __init__(self, cluster) -> None:  # type: ignore[no-untyped-def]
        super().__init__(seed=0)
        self.cluster, self.restarts = cluster, []

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        if not self.restarts:
            self.cluster.stop("fast")
            self.restarts.append(threading.Timer(3.0, self.cluster.start))
            self.restarts[0].start()
        return super().infer_relative_search_space(study, trial)

    def __getstate__(self) -> dict:  # the trial's process gets a copy without the timer or the server (its
        return {**self.__dict__, "restarts": [None], "cluster": None}  # class is in a conftest module)


def test_the_server_going_away_during_a_trials_check_does_not_stop_the_run(postgres_cluster) -> None:
    url = postgres_cluster.url()
    guard = omp.MemoryGuard(fixed_footprint, omp.Budget(ram="400MiB"))
    sampler = StopsTheServerOnce(postgres_cluster)
    study = optuna.create_study(storage=url, study_name="check", sampler=guard.wrap_sampler(sampler))
    try:
        omp.optimize(
            study,
            nap,
            guard=guard,
            host=Ledger(HostCapacity(ram=500 * MiB), url=url, host="h"),
            n_trials=2,
            show_progress_bar=False,
        )  # raised "the sampler failed: StorageInternalError" before
    finally:
        if sampler.restarts:
            sampler.restarts[0].join()
    trials = optuna.load_study(storage=url, study_name="check").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
