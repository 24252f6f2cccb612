"""Bad input and faults around the process-per-trial runner, as a new user meets them: real runners (the
``memprune worker`` command), real SQLite storages and a real host ledger in a cache dir of the test's own.

Each case asserts the exact outcome: one line naming what was wrong and what to do (no traceback, nothing
created), or the trial's final state and reason, with nothing left RUNNING and no process left behind.
This module also serves the workers it starts the footprints and guards named below (``test_runner:...``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.ledger import HostBudget, Ledger, LedgerError, read_host

HERE = Path(__file__).resolve().parent
GUARD_TESTS = HERE.parent / "guard"  # _runner_objectives: the objectives and footprint the runner tests use
if str(GUARD_TESTS) not in sys.path:
    sys.path.insert(0, str(GUARD_TESTS))
import _runner_objectives as objectives  # noqa: E402

MiB = 2**20
HOST = socket.gethostname()
FAST = ["--footprint", "_runner_objectives:footprint", "--ram", "1GiB", "--sampler", "random", "--no-progress"]
pytestmark = pytest.mark.slow


# -- what the workers started here load from this module ------------------------------------------------


def slow_footprint(params: dict) -> omp.Footprint:
    """A footprint that takes $MEMPRUNE_TEST_SLOW_S seconds (default 60); each call first appends its params
    to the file named by $MEMPRUNE_TEST_CALLS, so a test sees when it is being called."""
    with open(os.environ["MEMPRUNE_TEST_CALLS"], "a") as f:
        f.write(json.dumps(params) + "\n")
    time.sleep(float(os.environ.get("MEMPRUNE_TEST_SLOW_S", "60")))
    return objectives.footprint(params)


def not_a_guard() -> int:
    return 42


def broken_guard() -> omp.MemoryGuard:
    raise RuntimeError("the guard's config file is missing")


def leave_helper(trial: optuna.Trial) -> float:
    """Starts a helper process that would sleep 300 s, writes its pid to $MEMPRUNE_TEST_MARKER and returns
    without waiting for it (a data loader left behind)."""
    trial.suggest_int("mb", 8, 64)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    marker = os.environ["MEMPRUNE_TEST_MARKER"]
    with open(marker + ".tmp", "w") as f:
        f.write(str(helper.pid))
    os.replace(marker + ".tmp", marker)
    return 1.0


# -- helpers -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache dir of the test's own: the default host ledger lives there, for this process and its workers."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(cache))
    monkeypatch.delenv("OPTUNA_STORAGE", raising=False)
    return cache


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(GUARD_TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, **extra}


def memprune(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``memprune ARGS`` in a fresh process, run from this directory (so ``test_runner:...`` loads)."""
    return subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", *args],
        cwd=HERE,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "optuna_memprune.cli", "worker", *args],
        cwd=HERE,
        env=env or _env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_line_error(proc: subprocess.CompletedProcess, code: int, message: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == f"memprune: error: {message}\n", proc.stderr


def wait_for(predicate, what: str, proc: subprocess.Popen | None = None, seconds: float = 120) -> None:
    """A generous hang guard, not a timing: fails only if ``what`` never happens."""
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the worker ended before {what}: {proc.communicate()[1][-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"{what} never happened")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def states(url: str, name: str = "s") -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name=name, storage=url).trials]


def report_json(url: str) -> dict:
    proc = memprune("report", url, "-f", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# -- 1. a dead runner's trial, when a runner of another storage reaps first ------------------------------


def test_a_runner_of_another_storage_leaves_a_dead_runners_trial_to_a_runner_of_its_storage(tmp_path: Path) -> None:
    c_url, b_url = f"sqlite:///{tmp_path / 'c.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    marker = tmp_path / "trial-pid"
    first = memprune("worker", "_runner_objectives:hold", *FAST, "--storage", c_url, "--study", "s", "--n-trials", "1")
    assert first.returncode == 0, first.stderr
    # runner C is SIGKILLed while its trial #1 runs
    c = worker(
        "_runner_objectives:wait_to_be_killed",
        *FAST,
        "--storage",
        c_url,
        "--study",
        "s",
        "--n-trials",
        "1",
        env=_env(MEMPRUNE_TEST_MARKER=str(marker)),
    )
    try:
        wait_for(marker.exists, "trial #1 started", c)
    finally:
        c.kill()
        c.communicate()
    child = int(marker.read_text())
    wait_for(lambda: gone(child), "the trial's process died with its runner")
    # runner B, of another study database on the same host ledger, reaps C's entry first
    b = memprune("worker", "_runner_objectives:hold", *FAST, "--storage", b_url, "--study", "s", "--n-trials", "1")
    assert b.returncode == 0, b.stderr
    assert (
        f"The runner of trial 1 of study 's' (pid {c.pid}) died; that study is in another storage, so the trial "
        "stays RUNNING until a runner of its storage starts on this host and fails it."
    ) in b.stderr
    assert states(b_url) == [TrialState.COMPLETE]
    entries, reaped = read_host()
    assert entries == [] and [r.entry.owner_pid for r in reaped] == [c.pid]
    # meanwhile the report shows the trial RUNNING, with its runner dead, in every format
    assert states(c_url) == [TrialState.COMPLETE, TrialState.RUNNING]
    data = report_json(c_url)
    params = optuna.load_study(study_name="s", storage=c_url).trials[1].params
    note = (
        f"its runner (pid {c.pid} on host {HOST}) died while the trial ran; the next runner of this study's "
        "storage on this host fails the trial"
    )
    assert data["running"] == [
        {
            "number": 1,
            "state": "RUNNING",
            "params": params,
            "note": note,
            "runner": {"pid": c.pid, "host": HOST, "alive": False},
        }
    ]
    table = memprune("report", c_url)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("1 "))
    assert row.split()[:3] == ["1", "RUNNING", "dead"] and "died while the trial ran" in row
    html = memprune("report", c_url, "-f", "html")
    assert html.returncode == 0 and '<section id="running">' in html.stdout and "<td>dead</td>" in html.stdout
    # the next runner of C's storage fails it, with the reason, and settles the reaped entry
    again = memprune("worker", "_runner_objectives:hold", *FAST, "--storage", c_url, "--study", "s", "--n-trials", "1")
    assert again.returncode == 0, again.stderr
    study = optuna.load_study(study_name="s", storage=c_url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    record = omp.read_record(study.trials[1].user_attrs)
    assert record.reason.startswith(f"its runner (pid {c.pid} on host {HOST}) died while the trial ran; reaped by pid ")
    assert record.decision.value == "admitted" and record.host == HOST  # as it was launched
    assert read_host() == ([], [])
    assert "running" not in report_json(c_url)


# -- 2. a per-trial budget larger than the machine, or than the host's capacity ----------------------------------------------------------


def test_a_budget_larger_than_the_machine_is_refused_before_any_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    total = psutil.virtual_memory().total
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram=4 * total))
    study = optuna.create_study(
        storage=url,
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
        pruner=guard.wrap_pruner(None),
    )
    host = HostBudget(ram="4GiB", gpus=None, headroom=0.0)
    expected = (
        f"the per-trial {guard.budget} is more than this machine has: RAM {omp.format_bytes(4 * total)} > "
        f"{omp.format_bytes(total)} in all (host {HOST!r} may reserve 4.00 GiB for all its trials); lower the "
        "budget (one meant for a bigger machine?)."
    )
    with pytest.raises(ValueError) as refused:
        omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=2, host=host)
    assert str(refused.value) == expected and study.trials == []
    # the worker: exit 2, the same line, and no study created
    one_line_error(
        memprune(
            "worker",
            "_runner_objectives:hold",
            "--footprint",
            "_runner_objectives:footprint",
            "--ram",
            str(4 * total),
            "--host-ram",
            "4GiB",
            "--headroom",
            "0",
            "--storage",
            f"sqlite:///{tmp_path / 'w.db'}",
            "--study",
            "s",
        ),
        2,
        expected,
    )
    assert not (tmp_path / "w.db").exists()


@pytest.mark.parametrize(
    "budget, host, misfit",
    [
        (
            omp.Budget(ram="1GiB"),
            HostBudget(ram="700MiB", gpus=None, headroom=0.0),
            "ram 1.00 GiB > capacity 700.00 MiB",
        ),
        (omp.Budget(ram="1GiB", threads=64), HostBudget(ram="4GiB", gpus=None, threads=16), "threads 64 > capacity 16"),
    ],
)
def test_a_budget_over_the_hosts_capacity_is_capped_for_unchecked_trials_with_a_warning(
    tmp_path: Path, budget: omp.Budget, host: HostBudget, misfit: str
) -> None:
    guard = omp.MemoryGuard(objectives.footprint, budget)  # no search space: trial 0 runs unchecked
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 's.db'}",
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=1)),
        pruner=guard.wrap_pruner(None),
    )
    study.enqueue_trial({"mb": 8})
    study.enqueue_trial({"mb": 8})
    with pytest.warns(UserWarning) as warned:
        omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=2, host=host)
    assert [str(w.message) for w in warned] == [
        f"The per-trial {budget} is more than host {HOST!r} may reserve for all its trials ({misfit}): a trial "
        "unchecked at launch reserves the host's whole capacity instead (it runs alone) and is still stopped at its "
        "budget. Give the host's real capacity (host=HostBudget(...); memprune worker --host-ram, --host-threads, "
        "--host-gpus) or lower the budget."
    ]
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert [omp.read_record(t.user_attrs).decision.value for t in study.trials] == ["unchecked", "admitted"]


# -- 4. a slow footprint: the trial's end is written first; a runner killed meanwhile leaves nothing -------


def test_a_trial_unchecked_at_launch_ends_without_calling_the_footprint_again(tmp_path: Path, monkeypatch) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("MEMPRUNE_TEST_CALLS", str(calls))
    guard = omp.MemoryGuard(slow_footprint, omp.Budget(ram="1GiB"))  # no search space: trial 0 is unchecked
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 's.db'}",
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )
    omp.optimize(
        study,
        functools.partial(objectives.hold, seconds=0.0),
        guard=guard,
        n_trials=1,
        host=HostBudget(ram="4GiB", gpus=None),
    )
    (trial,) = study.trials
    record = omp.read_record(trial.user_attrs)
    assert trial.state is TrialState.COMPLETE and not calls.exists()  # the 60 s footprint was never called
    assert record.decision.value == "unchecked" and record.pred_ram is None and record.peak_ram > 0
    assert record.reason == (
        "the search space was not known before launch (no earlier trial; pass search_space= to "
        "MemoryGuard to check the first trial too)"
    )


def test_a_runner_killed_during_a_slow_footprint_leaves_no_trial_running(tmp_path: Path) -> None:
    url, calls = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "calls"
    run = worker(
        "_runner_objectives:hold",
        "--footprint",
        "test_runner:slow_footprint",
        "--ram",
        "1GiB",
        "--sampler",
        "random",
        "--no-progress",
        "--storage",
        url,
        "--study",
        "s",
        "--n-trials",
        "2",
        env=_env(MEMPRUNE_TEST_CALLS=str(calls)),
    )
    try:
        # trial 0 ran unchecked; trial 1 is checked against the space learned from it: the footprint sleeps
        wait_for(calls.exists, "the footprint was called for trial 1", run)
        assert states(url) == [TrialState.COMPLETE, TrialState.RUNNING]  # trial 0's end came first
        data = report_json(url)
        assert data["running"][0]["runner"] == {"pid": run.pid, "host": HOST, "alive": True}
        assert data["running"][0]["note"] == f"its runner (pid {run.pid} on host {HOST}) is about to launch the trial"
    finally:
        run.kill()
        run.communicate()
    assert report_json(url)["running"][0]["runner"]["alive"] is False
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"))
    study = optuna.load_study(
        study_name="s",
        storage=url,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
        pruner=guard.wrap_pruner(None),
    )
    omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    reason = omp.read_record(study.trials[1].user_attrs).reason
    assert reason.startswith(
        f"its runner (pid {run.pid} on host {HOST}) died before the trial's process started; reaped by pid "
    ), reason
    assert read_host() == ([], [])


def _ask_and_die(url: str, trials: int) -> int:
    """A real process that asks ``trials`` trials of study "s" as a runner of this host asks them (marked with
    its identity in the same write) and is SIGKILLed before any other write; its pid."""
    code = (
        "import os, optuna\n"
        "from optuna_memprune import _internals\n"
        "from optuna_memprune.runner._owners import RUNNER, runner_mark\n"
        f"study = optuna.load_study(study_name='s', storage={url!r})\n"
        f"for _ in range({trials}):\n"
        f"    _internals.ask_marked(study, {{RUNNER: runner_mark({HOST!r})}})\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    died = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert died.returncode == -9, died.stderr
    return int(died.stdout)


def test_a_runner_killed_before_it_named_its_trial_on_the_ledger_leaves_no_trial_running(tmp_path: Path) -> None:
    from optuna_memprune import _internals
    from optuna_memprune.runner._owners import RUNNER, runner_mark

    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="s", storage=url)
    # A real process asks a trial as the runner asks it (marked with its identity in the same write) and is
    # killed before its next write: the window between the ask and the ledger's entry naming the trial.
    pid = _ask_and_die(url, 1)
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"))
    study = optuna.load_study(
        study_name="s",
        storage=url,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
        pruner=guard.wrap_pruner(None),
    )
    _internals.ask_marked(study, {RUNNER: runner_mark(HOST)})  # one this live process asked: not a dead one's
    assert states(url) == [TrialState.RUNNING, TrialState.RUNNING]
    omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1)
    assert states(url) == [TrialState.FAIL, TrialState.RUNNING, TrialState.COMPLETE]
    assert omp.read_record(study.trials[0].user_attrs).reason == (
        f"its runner (pid {pid} on host {HOST}) died before it named the trial on the host ledger"
    )
    assert study.trials[2].system_attrs[RUNNER]["pid"] == os.getpid()  # the runner's own trial carries its mark
    assert read_host() == ([], [])


def test_dead_runners_trials_are_looked_for_among_the_trials_just_read(tmp_path: Path) -> None:
    """``DeadRunners.end_trials(trials)``, as the runner calls it after a trial's check, with the trials that
    trial's ask read: a dead runner's trial in them is failed; one that ended after they were read is read again
    and left as it ended."""
    from optuna_memprune import _internals
    from optuna_memprune.runner._owners import DeadRunners

    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="s", storage=url)
    _ask_and_die(url, 2)
    study = optuna.load_study(study_name="s", storage=url)
    read = list(_internals.cached_trials(study))  # as the check read them: both RUNNING
    assert [t.state for t in read] == [TrialState.RUNNING, TrialState.RUNNING]
    study.tell(read[1].number, 1.0)  # ended after the read (here by this process)
    DeadRunners(study, None, omp.Budget(ram="1GiB"), host=HOST).end_trials([])  # looked for there only
    assert states(url) == [TrialState.RUNNING, TrialState.COMPLETE]
    DeadRunners(study, None, omp.Budget(ram="1GiB"), host=HOST).end_trials(read)
    assert states(url) == [TrialState.FAIL, TrialState.COMPLETE]
    assert "died before the trial ended" in omp.read_record(study.trials[0].user_attrs).reason


# -- 6. the worker's command line, the ledger file and the cache dir -------------------------------------


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["test_runner:os", *FAST],
            2,
            "the objective 'test_runner:os' is a module: give the module:function that takes a trial and returns its value",
        ),
        (
            ["test_runner:not_a_guard", *FAST],
            2,
            "the objective 'test_runner:not_a_guard' is a function that does not "
            "take one trial: give the module:function that takes a trial and returns its value",
        ),
        (
            ["_runner_objectives:hold", "--guard", "_runner_objectives:footprint"],
            2,
            "--guard '_runner_objectives:footprint' is a function that takes arguments (a footprint function? give it as "
            "--footprint with --ram/--vram/--threads): --guard takes a MemoryGuard, or a function of no arguments that "
            "returns one",
        ),
        (
            ["_runner_objectives:hold", "--guard", "test_runner:HOST"],
            2,
            "--guard 'test_runner:HOST' is a str: give a MemoryGuard, or a function of no arguments that returns one",
        ),
        (
            ["_runner_objectives:hold", "--guard", "test_runner:not_a_guard"],
            2,
            "--guard 'test_runner:not_a_guard' returned an int, not a MemoryGuard",
        ),
        (
            ["_runner_objectives:hold", "--guard", "test_runner:broken_guard"],
            1,
            "--guard 'test_runner:broken_guard' raised RuntimeError: the guard's config file is missing",
        ),
        (["_runner_objectives:hold", *FAST, "--n-workers", "0"], 2, "--n-workers must be a positive int, but got 0."),
        (
            ["_runner_objectives:hold", *FAST, "--n-trials", "-1"],
            2,
            "--n-trials must be a non-negative int, but got -1.",
        ),
        (
            ["_runner_objectives:hold", *FAST, "--timeout", "-5"],
            2,
            "--timeout must be a non-negative number of seconds, but got -5.0.",
        ),
    ],
)
def test_worker_bad_input_is_one_line_and_creates_no_study(tmp_path: Path, args: list, code: int, message: str) -> None:
    one_line_error(
        memprune("worker", *args, "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "s"), code, message
    )
    assert not (tmp_path / "s.db").exists()


def test_a_corrupted_ledger_or_an_unusable_cache_dir_is_one_line_naming_the_file(tmp_path: Path, _cache: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    argv = ["worker", "_runner_objectives:hold", *FAST, "--storage", url, "--study", "s", "--n-trials", "1"]
    ledger = _cache / f"ledger-{HOST}.sqlite"
    _cache.mkdir()
    ledger.write_bytes(b"not a ledger, garbage written over it\n" * 100)
    one_line_error(
        memprune(*argv),
        1,
        f"the host ledger {ledger} is not a readable SQLite database (file is not a database): delete it "
        "(it holds only the reservations of this host's running trials) or set MEMPRUNE_CACHE_DIR to "
        "another directory",
    )
    with pytest.raises(LedgerError, match="is not a readable SQLite database"):
        Ledger(HostBudget(gpus=None))
    assert not (tmp_path / "s.db").exists()
    # /proc: a directory nobody (root included) can create a file in
    one_line_error(
        memprune(*argv, env=_env(MEMPRUNE_CACHE_DIR="/proc")),
        1,
        f"cannot open the host ledger /proc/ledger-{HOST}.sqlite (unable to open database file): make its "
        "directory writable or set MEMPRUNE_CACHE_DIR to another directory",
    )
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    one_line_error(
        memprune(*argv, env=_env(MEMPRUNE_CACHE_DIR=str(a_file))),
        1,
        f"the cache directory {a_file} of the host ledger is a file, not a directory: set "
        "MEMPRUNE_CACHE_DIR to a writable directory",
    )
    assert not (tmp_path / "s.db").exists()
    # what the message says to do works
    ledger.unlink()
    done = memprune(*argv)
    assert done.returncode == 0, done.stderr
    assert states(url) == [TrialState.COMPLETE] and read_host() == ([], [])


# -- 7. the runner stopped from outside; what a trial leaves behind; more of the worker's command line -----


@pytest.mark.parametrize(
    "how, code, why",
    [
        ("SIGTERM", 143, "the runner was terminated (SIGTERM)"),
        ("Ctrl-C", 130, "the runner was interrupted (Ctrl-C)"),
    ],
)
def test_sigterm_or_ctrl_c_of_the_runner_ends_its_running_trial(tmp_path: Path, how: str, code: int, why: str) -> None:
    url, marker = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "trial-pid"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "optuna_memprune.cli",
            "worker",
            "_runner_objectives:wait_to_be_killed",
            *FAST,
            "--storage",
            url,
            "--study",
            "s",
            "--n-trials",
            "3",
        ],
        cwd=HERE,
        env=_env(MEMPRUNE_TEST_MARKER=str(marker)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(marker.exists, "trial #0 started", run)
        if how == "SIGTERM":
            run.terminate()  # the worker alone, as a scheduler ends a job
        else:
            os.killpg(run.pid, signal.SIGINT)  # the terminal's whole process group
        _, err = run.communicate(timeout=120)  # a hang guard
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == code, err
    assert "Traceback" not in err, err
    wait_for(lambda: gone(int(marker.read_text())), "the trial's process is gone")
    (trial,) = optuna.load_study(study_name="s", storage=url).trials
    assert trial.state is TrialState.FAIL
    assert omp.read_record(trial.user_attrs).reason.endswith(f"; {why} while the trial ran")
    assert read_host() == ([], [])


def test_a_helper_the_objective_leaves_running_is_killed_when_its_trial_ends(tmp_path: Path) -> None:
    url, marker = f"sqlite:///{tmp_path / 's.db'}", tmp_path / "helper-pid"
    done = memprune(
        "worker",
        "test_runner:leave_helper",
        *FAST,
        "--storage",
        url,
        "--study",
        "s",
        "--n-trials",
        "1",
        env=_env(MEMPRUNE_TEST_MARKER=str(marker)),
    )
    assert done.returncode == 0, done.stderr
    helper = int(marker.read_text())
    try:
        wait_for(lambda: gone(helper), "the helper is gone")
    finally:
        if not gone(helper):
            os.kill(helper, signal.SIGKILL)
    assert states(url) == [TrialState.COMPLETE]


def test_callbacks_that_are_not_functions_are_refused_before_any_trial(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"))
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 's.db'}",
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
        pruner=guard.wrap_pruner(None),
    )
    with pytest.raises(TypeError) as refused:
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, callbacks=[print, 5])
    assert str(refused.value) == (
        "callbacks must be a list of functions callback(study, frozen_trial), but callbacks[1] is int 5."
    )
    with pytest.raises(TypeError, match="^callbacks must be a list of functions"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, callbacks=print)
    assert study.trials == []


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--ledger", "nosuchdb://x"],
            "--ledger: 'nosuchdb://x' is not a database URL SQLAlchemy can open (Can't load "
            "plugin: sqlalchemy.dialects:nosuchdb): give e.g. sqlite:////path/ledger.sqlite or postgresql+psycopg://user@host/db",
        ),
        (["--host-id", ""], "--host-id must be a non-empty name of at most 255 characters, but got ''"),
        (
            ["--guard", "_runner_objectives:guard"],
            "give either --guard (a MemoryGuard with its budget) or --footprint with --ram/--vram/--threads, not both",
        ),
    ],
)
def test_worker_ledger_host_id_and_guard_conflicts_are_one_line(
    tmp_path: Path, _cache: Path, args: list, message: str
) -> None:
    one_line_error(
        memprune(
            "worker",
            "_runner_objectives:hold",
            *FAST,
            *args,
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--study",
            "s",
        ),
        2,
        message,
    )
    assert not (tmp_path / "s.db").exists() and not _cache.exists()


def test_worker_direction_must_agree_with_the_existing_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(storage=url, study_name="s", direction="maximize")
    argv = ["worker", "_runner_objectives:hold", *FAST, "--storage", url, "--study", "s", "--n-trials", "1"]
    one_line_error(
        memprune(*argv, "--direction", "minimize"),
        2,
        "--direction minimize disagrees with study 's', which is maximize: leave --direction out to run "
        "the study as it is",
    )
    assert states(url) == []
    for extra in (["--direction", "maximize"], []):  # the study's own direction, or none given
        done = memprune(*argv, *extra)
        assert done.returncode == 0, done.stderr
    assert states(url) == [TrialState.COMPLETE, TrialState.COMPLETE]
