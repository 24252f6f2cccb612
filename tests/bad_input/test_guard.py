"""Bad input to Budget and MemoryGuard, and footprints that fail, hang or meet a new branch (issue 14).

Each case asserts the exact outcome: the one-line error naming the value and what was expected, or the end
state and reason of every trial of a real study on a SQLite file (nothing left RUNNING).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import warnings
from importlib.util import find_spec
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.guard import Decision, MemoryGuard
from optuna_memprune.guard.backend import policy_of, warnings_of
from optuna_memprune.monitor import gpu_reader

MiB = 2**20
RAM_WHY = "a Python process running an Optuna trial takes more"
EIB_WHY = "1 EiB (2**60 bytes: no machine has more memory)"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _one_line_error(error: type[Exception], call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _base() -> int:
    """This process's RSS plus headroom: the budget is the whole process's, so footprints start here."""
    return psutil.Process().memory_info().rss + 512 * MiB


def _study(tmp_path: Path, guard: MemoryGuard, name: str = "s") -> optuna.Study:
    return optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name=name,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )


def _records(study: optuna.Study) -> list[omp.guard.TrialRecord]:
    trials = study.get_trials()
    assert all(t.state is not TrialState.RUNNING for t in trials), [t.state for t in trials]
    out = [omp.read_record(t.user_attrs) for t in trials]
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def _footprint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memprune-footprint"]


def _no_footprint_threads(within: float = 30, whose: str = "an earlier test's footprint worker") -> None:
    """Wait up to ``within`` seconds for every footprint worker of this process to end (an abandoned call, a
    worker's idle second): a test that counts them first waits out those an earlier test left."""
    deadline = time.monotonic() + within
    while _footprint_threads():
        assert time.monotonic() < deadline, f"{whose} did not end"
        time.sleep(0.01)


# -- item 3: budgets no process runs in, and sizes beyond any machine --------------------------------------


@pytest.mark.parametrize("ram, given", [(0, "0"), (1, "1"), ("0.4", "'0.4' (0 B)"), ("31MiB", "'31MiB' (31 MiB)")])
def test_a_ram_budget_below_any_process_is_refused_with_the_floor(ram, given) -> None:
    assert _one_line_error(ValueError, omp.Budget, ram=ram) == (
        f"Budget.ram must be at least 32 MiB ({RAM_WHY}), but got {given}."
    )


@pytest.mark.parametrize("ram", ["1e30TiB", "1e400", 2**60 + 1, 1e300])
def test_a_size_beyond_any_machine_is_refused_with_the_ceiling(ram) -> None:
    assert _one_line_error(ValueError, omp.Budget, ram=ram) == f"Budget.ram must be at most {EIB_WHY}, but got {ram!r}."
    assert _one_line_error(ValueError, omp.Budget, vram=ram) == (
        f"Budget.vram must be at most {EIB_WHY}, but got {ram!r}."
    )


def test_a_vram_budget_of_zero_and_absurd_thread_counts_are_refused() -> None:
    assert _one_line_error(ValueError, omp.Budget, vram=0) == (
        "Budget.vram must be at least 2 MiB (the smallest block the CUDA allocator reserves; leave vram unset "
        "for no VRAM budget), but got 0."
    )
    for threads in (0, -1, 2**22 + 1, True, 2.0):
        assert _one_line_error(ValueError, omp.Budget, threads=threads) == (
            f"Budget.threads must be an int in [1, 4194304] (Linux runs no more threads) or None, but got {threads!r}."
        )
    assert omp.Budget(ram="32MiB", vram="2MiB", threads=2**22).resources == {
        "ram": 32 * MiB,
        "vram": 2 * MiB,
        "threads": 2**22,
    }


@pytest.mark.parametrize("threads, soft, need", [(1, 0.9, 3), (2, 0.9, 3), (1, 1.0, 2), (3, 0.5, 4), (39, 0.05, 40)])
def test_a_thread_budget_the_guarded_process_cannot_run_in_is_refused(threads, soft, need) -> None:
    budget = omp.Budget(threads=threads)  # a Budget alone may say 1 thread; a guarded process runs 2
    assert _one_line_error(ValueError, MemoryGuard, lambda p: omp.Footprint(), budget, soft=soft) == (
        f"Budget.threads must be at least {need} with soft={soft:g} (the guarded process runs 2 threads itself, "
        f"its main thread and the guard's monitor, and soft x threads must hold them), but got {threads}."
    )
    MemoryGuard(lambda p: omp.Footprint(), omp.Budget(threads=need), soft=soft)


def test_a_ram_soft_line_below_any_process_is_refused() -> None:
    assert _one_line_error(ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="40MiB"), soft=0.5) == (
        f"The RAM soft line (soft=0.5 x Budget.ram 40.00 MiB) must be at least 32.00 MiB ({RAM_WHY}): raise ram "
        "or soft."
    )
    assert _one_line_error(ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), soft=1e-9)


def test_the_smallest_thread_budget_clamps_without_dividing_by_zero(tmp_path: Path) -> None:
    # Before: a soft line of 0 threads made the clamp search divide by zero, and every trial ran unchecked
    # blaming the footprint. Now the smallest budget the guard accepts clamps like any other.
    space = {"workers": IntDistribution(0, 8)}
    guard = MemoryGuard(
        lambda p: omp.Footprint.of(ram="1MiB", threads=1 + p["workers"]), omp.Budget(threads=3), search_space=space
    )
    study = _study(tmp_path, guard)
    # The sampler's check only: the monitor would read this test process's own threads (pytest's, and any
    # earlier test's), not a trial's.
    study.optimize(lambda t: t.suggest_int("workers", 0, 8), n_trials=6)
    records = _records(study)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    for trial, record in zip(study.trials, records):
        assert record.decision in (Decision.ADMITTED, Decision.CLAMPED), record.reason
        assert trial.params["workers"] <= 1 and "footprint" not in record.reason


# -- item 4: a footprint that takes too long ------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "5", True])
def test_footprint_timeout_must_be_positive_seconds_or_none(value) -> None:
    assert _one_line_error(
        ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), footprint_timeout=value
    ) == (f"footprint_timeout must be a positive number of seconds or None, but got {value!r}.")
    unlimited = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), footprint_timeout=None)
    assert policy_of(unlimited).footprint_timeout is None
    assert policy_of(MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"))).footprint_timeout == 5.0


def _in_a_thread(call):  # type: ignore[no-untyped-def]
    """``call()`` in a thread of its own (not the main thread), its answer or error here."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised again below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_footprint_slower_than_its_limit_runs_the_trial_unchecked_without_piling_up_threads(tmp_path) -> None:
    # pytest-timeout's SIGALRM timer runs: as in a program that uses SIGALRM itself, every call goes to the
    # footprint's worker thread, abandoned past the limit.
    _no_footprint_threads()
    base = _base()
    release, stuck = threading.Event(), threading.Event()
    calls = []

    def footprint(params: dict) -> omp.Footprint:
        assert threading.current_thread().name == "memprune-footprint"
        calls.append(params)
        if len(calls) == 2:  # the first trial's call hangs (as one waiting on a lock or a network would)
            stuck.set()
            release.wait(60)
        return omp.Footprint.of(ram=base + params["x"] * MiB)

    guard = MemoryGuard(
        footprint, omp.Budget(ram=base + 2**30), search_space={"x": IntDistribution(1, 9)}, footprint_timeout=0.5
    )
    policy_of(guard).predict({"x": 0})  # answered once: the cold-start allowance is spent
    study = _study(tmp_path, guard)
    threads_seen = []

    def objective(trial: optuna.Trial) -> float:
        threads_seen.append(len(_footprint_threads()))
        if trial.number == 1:  # the hung call returns now; its answer still fills the cache
            release.set()
            _no_footprint_threads(10, "the footprint's worker thread")
        return float(trial.suggest_int("x", 1, 9))

    start = time.monotonic()
    try:
        study.optimize(guard.wrap_objective(objective), n_trials=4)
    finally:
        release.set()
    assert time.monotonic() - start < 30  # a hang guard, not a timing: the footprint would block for 60 s
    records = _records(study)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert (records[0].decision, records[0].reason) == (
        Decision.UNCHECKED,
        "the footprint took longer than 0.5 s; the trial runs unchecked under the monitor",
    )
    assert (records[1].decision, records[1].reason) == (
        Decision.UNCHECKED,
        "the footprint took longer than 0.5 s (an earlier call that took longer than 0.5 s "
        "still runs); the trial runs unchecked under the monitor",
    )
    assert [r.decision for r in records[2:]] == [Decision.ADMITTED] * 2
    assert threads_seen[:2] == [1, 1]  # the hung call only: the second trial started no thread behind it
    before = len(calls)
    assert policy_of(guard).predict(dict(study.trials[0].params)).ram == base + study.trials[0].params["x"] * MiB
    assert len(calls) == before  # the hung call's late answer filled the cache
    assert omp.read_record(study.trials[0].user_attrs).pred_ram is None  # never re-predicted while hung


@pytest.mark.parametrize("catches", [False, True], ids=["catches-errors", "catches-everything"])
@pytest.mark.timeout(120, method="thread")  # SIGALRM left free, as in most programs
def test_in_the_main_thread_a_footprint_runs_there_and_is_interrupted_at_its_limit(tmp_path, catches) -> None:
    # A study's usual optimize(n_jobs=1): the call runs in the main thread (no worker thread to wake), and a
    # SIGALRM timer interrupts it past the limit; from then on calls go to the worker, which a slow call
    # would complete in.
    base = _base()
    where, finished = [], []

    def footprint(params: dict) -> omp.Footprint:
        where.append(threading.current_thread().name)
        for _attempt in range(3 if params["x"] == 2 else 0):
            try:
                time.sleep(30)
                finished.append(params["x"])
            except Exception:  # noqa: BLE001 - the interrupt is no Exception: a fallback never takes it
                finished.append("fallback")
            except BaseException:  # a retry loop that swallows everything is interrupted at every tick
                if not catches:
                    raise
        return omp.Footprint.of(ram=base + params["x"] * MiB)

    guard = MemoryGuard(
        footprint, omp.Budget(ram=base + 2**30), search_space={"x": IntDistribution(1, 9)}, footprint_timeout=0.5
    )
    policy_of(guard).predict({"x": 5})  # the cold start, in the worker
    study = _study(tmp_path, guard)
    for x in (1, 2, 3):
        study.enqueue_trial({"x": x})
    start = time.monotonic()
    study.optimize(guard.wrap_objective(lambda t: float(t.suggest_int("x", 1, 9))), n_trials=3)
    assert time.monotonic() - start < 20  # a hang guard, not a timing: the sleep was cut at the limit
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert [(r.decision, r.reason) for r in _records(study)][1] == (
        Decision.UNCHECKED,
        "the footprint took longer than 0.5 s; the trial runs unchecked under the monitor",
    )
    assert [r.decision for r in _records(study)][::2] == [Decision.ADMITTED] * 2
    assert where == ["memprune-footprint", "MainThread", "MainThread", "memprune-footprint"]
    assert finished == []
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.timeout(120, method="thread")  # SIGALRM left free: the program's own handler below takes it
def test_a_program_that_handles_sigalrm_keeps_its_handler_and_footprint_calls_go_to_the_worker() -> None:
    where = []
    guard = MemoryGuard(
        lambda p: where.append(threading.current_thread().name) or omp.Footprint.of(ram=p["x"]), omp.Budget(ram="64GiB")
    )

    def mine(signum: int, frame: object) -> None:
        pass

    policy_of(guard).predict({"x": 0})
    previous = signal.signal(signal.SIGALRM, mine)
    try:
        policy_of(guard).predict({"x": 1})
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 60)  # a timer of the program's own (signal.alarm)
        policy_of(guard).predict({"x": 2})
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60
        signal.signal(signal.SIGALRM, mine)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert signal.signal(signal.SIGALRM, previous) is mine
    policy_of(guard).predict({"x": 3})
    assert where == ["memprune-footprint"] * 3 + ["MainThread"]


# -- item 5: footprints that fail silently, VRAM nobody measures, monitor intervals ------------------------

_FAILING_STUDY = """
import sys
import optuna, optuna_memprune as omp

optuna.logging.set_verbosity(optuna.logging.WARNING)
mode, db = sys.argv[1], sys.argv[2]

def footprint(params):
    if mode == "raises":
        raise RuntimeError("layer sizes unknown")
    return None if mode == "none" else {"ram": params["x"]}

guard = omp.MemoryGuard(footprint, omp.Budget(ram="4GiB"),
                        search_space={"x": optuna.distributions.IntDistribution(1, 9)})
study = optuna.create_study(storage=f"sqlite:///{db}",
                            sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
study.optimize(guard.wrap_objective(lambda t: t.suggest_int("x", 1, 9)), n_trials=7)  # the user's line
"""

_REASONS = {
    "raises": "the footprint function failed: RuntimeError: layer sizes unknown",
    "none": "the footprint function failed: it returned None, not a Footprint",
    "dict": "the footprint function failed: it returned a dict, not a Footprint",
}


@pytest.mark.parametrize("mode", sorted(_REASONS))
def test_a_failing_footprint_is_said_once_on_stderr_at_the_users_line(tmp_path: Path, mode: str) -> None:
    script, db = tmp_path / "study.py", tmp_path / "study.db"
    script.write_text(_FAILING_STUDY)
    done = subprocess.run([sys.executable, str(script), mode, str(db)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reason = _REASONS[mode]
    line = 1 + next(i for i, s in enumerate(_FAILING_STUDY.splitlines()) if "the user's line" in s)
    expected = (
        f"{script}:{line}: UserWarning: The footprint failed on 3 trials in a row (trial 2: {reason}); such "
        "trials run unchecked, under the monitor only. Fix the footprint function, or pass "
        "MemoryGuard(..., on_footprint_error='raise') to stop at the first failure."
    )
    warned = [s for s in done.stderr.splitlines() if "UserWarning" in s]
    assert warned == [expected], done.stderr
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
    records = _records(study)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 7
    assert {(r.decision, r.reason) for r in records} == {(Decision.UNCHECKED, reason)}


def test_on_footprint_error_raise_ends_the_trial_fail_and_raises_the_footprints_error(tmp_path: Path) -> None:
    assert _one_line_error(
        ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), on_footprint_error="ignore"
    ) == ("on_footprint_error must be 'warn' or 'raise', but got 'ignore'.")
    guard = MemoryGuard(
        lambda p: None, omp.Budget(ram="1GiB"), search_space={"x": IntDistribution(1, 9)}, on_footprint_error="raise"
    )
    study = _study(tmp_path, guard)
    with pytest.raises(TypeError) as info:
        study.optimize(guard.wrap_objective(lambda t: t.suggest_int("x", 1, 9)), n_trials=3)
    assert str(info.value) == "the footprint function returned None, not a Footprint"
    assert getattr(info.value, "__notes__", None) in (
        None,
        [  # notes exist from Python 3.11
            "memprune: the footprint failed on trial 0 (MemoryGuard(on_footprint_error='raise'))"
        ],
    )
    (trial,) = study.trials
    assert trial.state is TrialState.FAIL
    assert (omp.read_record(trial.user_attrs).decision, omp.read_record(trial.user_attrs).reason) == (
        Decision.UNCHECKED,
        "the footprint function failed: it returned None, not a Footprint",
    )


def test_on_footprint_error_raise_in_the_runner_fails_the_trial_before_its_process_starts(tmp_path: Path) -> None:
    from optuna_memprune.ledger import HostBudget, Ledger

    def footprint(params: dict) -> omp.Footprint:
        raise RuntimeError("layer sizes unknown")

    guard = MemoryGuard(
        footprint, omp.Budget(ram="1GiB"), search_space={"x": IntDistribution(1, 9)}, on_footprint_error="raise"
    )
    study = _study(tmp_path, guard)
    ledger = Ledger(
        HostBudget(ram="8GiB", gpus=None, headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )
    children = set(psutil.Process().children(recursive=True))
    with pytest.raises(RuntimeError) as info:
        omp.optimize(study, _objective_x, guard=guard, n_trials=3, host=ledger)
    assert str(info.value) == "layer sizes unknown"
    (trial,) = study.trials
    assert trial.state is TrialState.FAIL
    assert "RuntimeError: layer sizes unknown" in omp.read_record(trial.user_attrs).reason
    assert ledger.entries() == []
    deadline = time.monotonic() + 10
    # the fork server (started before the first trial is asked) stops with the runner; multiprocessing's
    # resource tracker, started with it, is the interpreter's and lives as long as this process, as it would
    # after any trial process ran
    while {p for p in set(psutil.Process().children(recursive=True)) - children if not _resource_tracker(p)}:
        assert time.monotonic() < deadline, "a process outlived the runner"
        time.sleep(0.05)


def _resource_tracker(process: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return True


def _objective_x(trial: optuna.Trial) -> float:
    return float(trial.suggest_int("x", 1, 9))


def test_a_vram_budget_nobody_can_measure_warns_once() -> None:
    reader = gpu_reader()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"))
        guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(vram="8GiB"))
        warnings_of(guard).once("vram-unmeasured", "again")  # once per guard
    messages = [str(w.message) for w in caught]
    if reader is not None:  # a GPU NVML can see: VRAM is measured, nothing to say
        reader.close()
        assert messages == []
        return
    why = (
        "no driver or no GPU"
        if find_spec("pynvml")
        else 'nvidia-ml-py is not installed: pip install "optuna-memprune[gpu]"'
    )
    assert messages == [
        f"Budget.vram is set (8.00 GiB) but no GPU is visible to NVML here ({why}): VRAM is predicted only, never "
        "measured, and no trial is stopped for its VRAM."
    ]
    assert caught[0].filename == __file__


def test_a_vram_budget_without_nvidia_ml_py_names_the_extra_that_brings_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as where the gpu extra was not installed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MemoryGuard(lambda p: omp.Footprint(), omp.Budget(vram="8GiB"))
    assert [str(w.message) for w in caught] == [
        "Budget.vram is set (8.00 GiB) but no GPU is visible to NVML here (nvidia-ml-py is not installed: pip install "
        '"optuna-memprune[gpu]"): VRAM is predicted only, never measured, and no trial is stopped for its VRAM.'
    ]


@pytest.mark.parametrize("interval", [float("inf"), 1e-9, 0, -1, 10.5, float("nan"), "0.1"])
def test_monitor_interval_is_bounded_to_1_ms_to_10_s(interval) -> None:
    assert _one_line_error(
        ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), monitor_interval=interval
    ) == (f"monitor_interval must be a number of seconds in [0.001, 10.0] (1 ms to 10 s), but got {interval!r}.")


def test_monitor_interval_bounds_are_accepted() -> None:
    for interval in (0.001, 10):
        guard = MemoryGuard(lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), monitor_interval=interval)
        assert policy_of(guard).interval == interval


# -- item 8: conditional params ----------------------------------------------------------------------------


def _branchy(base: int):  # type: ignore[no-untyped-def]
    def footprint(params: dict) -> omp.Footprint:
        size = params["x"] if params["kind"] == "a" else params["y"]  # a KeyError on a branch not seen yet
        return omp.Footprint.of(ram=base + size * MiB)

    def objective(trial: optuna.Trial) -> float:
        if trial.suggest_categorical("kind", ["a", "b"]) == "a":
            return float(trial.suggest_int("x", 1, 9))
        return float(trial.suggest_int("y", 1, 9))

    return footprint, objective


def test_the_first_trial_of_a_new_branch_names_the_param_first_seen(tmp_path: Path) -> None:
    base = _base()
    footprint, objective = _branchy(base)
    guard = MemoryGuard(footprint, omp.Budget(ram=base + 2**30))
    study = _study(tmp_path, guard)
    for kind in ("a", "b", "b"):
        study.enqueue_trial({"kind": kind})
    study.optimize(guard.wrap_objective(objective), n_trials=3)
    records = _records(study)
    assert [r.decision for r in records] == [Decision.UNCHECKED, Decision.UNCHECKED, Decision.ADMITTED]
    assert records[0].reason == (
        "the search space was not known before launch (no earlier trial; pass "
        "search_space= to MemoryGuard to check the first trial too)"
    )
    assert records[1].reason == (
        "param 'y' was first seen in this trial (the guard checks a param before launch "
        "once an earlier trial suggested it, or when it is declared in "
        "MemoryGuard(search_space=...))"
    )
    assert records[1].pred_ram == base + study.trials[1].params["y"] * MiB  # predicted from what ran


def test_a_declared_search_space_checks_every_trial_branches_and_the_first_included(tmp_path: Path) -> None:
    base = _base()
    footprint, objective = _branchy(base)
    space = {"kind": CategoricalDistribution(["a", "b"]), "x": IntDistribution(1, 9), "y": IntDistribution(1, 9)}
    guard = MemoryGuard(footprint, omp.Budget(ram=base + 5 * MiB), search_space=space, soft=1.0)
    study = _study(tmp_path, guard)
    study.enqueue_trial({"kind": "b", "y": 9})  # trial 0 predicted over budget, its values fixed: not run
    study.enqueue_trial({"kind": "a"})
    study.optimize(guard.wrap_objective(objective), n_trials=6)
    records = _records(study)
    assert records[0].decision is Decision.REJECTED  # enqueued values are fixed: rejected rather than run
    assert study.trials[0].state is TrialState.PRUNED
    assert all(r.decision in (Decision.ADMITTED, Decision.CLAMPED, Decision.REJECTED) for r in records)


def test_a_name_the_footprint_asks_for_but_no_trial_suggests_is_a_footprint_error(tmp_path: Path) -> None:
    base = _base()

    def footprint(params: dict) -> omp.Footprint:
        return omp.Footprint.of(ram=base + params["widht"] * MiB)  # a typo: the objective suggests "width"

    guard = MemoryGuard(footprint, omp.Budget(ram=base + 2**30), on_footprint_error="raise")
    study = _study(tmp_path, guard)
    objective = guard.wrap_objective(lambda t: float(t.suggest_int("width", 1, 9)))
    study.optimize(objective, n_trials=2)  # trial 1 might be a new branch: it runs, and its record says
    with pytest.raises(KeyError, match="widht"):
        study.optimize(objective, n_trials=1)  # now known to be no param: the footprint's error
    records = _records(study)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
    assert records[1].reason == (
        "the footprint function failed: KeyError: 'widht' (the trial suggested no param 'widht')"
    )
    assert records[2].reason == "the footprint function failed: KeyError: 'widht'"


@pytest.mark.parametrize(
    "where", ["worker", pytest.param("main thread", marks=pytest.mark.timeout(300, method="thread"))]
)
def test_time_spent_calibrating_the_host_does_not_count_against_the_footprints_limit(
    tmp_path, monkeypatch, where
) -> None:
    # A recipe's first prediction measures the host in probe processes: the limit must not turn that into
    # unchecked trials, whether the call runs in the footprint's worker (called from another thread here) or
    # in the main thread under the SIGALRM timer. A footprint slow on its own still times out at the same limit.
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path / "cache"))  # a cold cache: this call calibrates
    call = _in_a_thread if where == "worker" else lambda f: f()

    def footprint(params: dict) -> omp.Footprint:
        return omp.estimate.process("torch", training=False) if params["x"] else omp.Footprint()

    calibrating = MemoryGuard(footprint, omp.Budget(ram="64GiB"), footprint_timeout=0.5)
    policy_of(calibrating).predict({"x": 0})  # answered once: no cold-start allowance from here on
    assert call(lambda: policy_of(calibrating).predict({"x": 1})).ram > 0  # its probes import torch: seconds
    assert list((tmp_path / "cache").glob("calibration-*.json"))
    slow = MemoryGuard(
        lambda p: time.sleep(2 * p["x"]) or omp.Footprint(), omp.Budget(ram="64GiB"), footprint_timeout=0.5
    )
    policy_of(slow).predict({"x": 0})
    with pytest.raises(TimeoutError, match=r"^the footprint took longer than 0\.5 s$"):
        call(lambda: policy_of(slow).predict({"x": 1}))


def test_a_footprints_first_call_may_take_longer_than_its_limit_for_a_cold_start(tmp_path: Path) -> None:
    # The first call imports and traces (seconds); from the second on, each call has footprint_timeout.
    base = _base()
    calls = []

    def footprint(params: dict) -> omp.Footprint:
        calls.append(params)
        if len(calls) in (1, 3):
            time.sleep(1.5)  # a cold start, then a call slow on its own
        return omp.Footprint.of(ram=base + params["x"] * MiB)

    guard = MemoryGuard(
        footprint, omp.Budget(ram=base + 2**30), search_space={"x": IntDistribution(1, 9)}, footprint_timeout=0.5
    )
    study = _study(tmp_path, guard)
    for x in (1, 2, 3):
        study.enqueue_trial({"x": x})
    study.optimize(guard.wrap_objective(lambda t: float(t.suggest_int("x", 1, 9))), n_trials=3)
    records = _records(study)
    assert [r.decision for r in records] == [Decision.ADMITTED, Decision.ADMITTED, Decision.UNCHECKED]
    assert records[2].reason == "the footprint took longer than 0.5 s; the trial runs unchecked under the monitor"


def _picklable_footprint(params: dict) -> omp.Footprint:
    return omp.Footprint.of(ram=params.get("x", 1) * MiB)


def test_the_new_choices_travel_with_the_pickled_guard() -> None:
    import pickle

    guard = MemoryGuard(
        _picklable_footprint,
        omp.Budget(ram="1GiB"),
        footprint_timeout=2.5,
        on_footprint_error="raise",
        monitor_interval=0.001,
    )
    again = pickle.loads(pickle.dumps(guard))
    policy = policy_of(again)
    assert (policy.footprint_timeout, policy.on_footprint_error, policy.interval) == (2.5, "raise", 0.001)
    assert policy_of(again).predict({"x": 3}).ram == 3 * MiB


def test_an_unknown_clamp_name_is_refused_at_construction_or_warned_once_never_raised_mid_trial(tmp_path) -> None:
    space = {"x": IntDistribution(1, 9)}
    assert _one_line_error(
        ValueError, MemoryGuard, lambda p: omp.Footprint(), omp.Budget(ram="1GiB"), clamp=["nope"], search_space=space
    ) == (
        "clamp names ['nope'] are not params of the search space ['x']; fix the names, or declare params that "
        "appear only in some branches in search_space=."
    )
    guard = MemoryGuard(lambda p: omp.Footprint.of(ram=_base()), omp.Budget(ram=_base() + 2**30), clamp=["nope"])
    study = _study(tmp_path, guard)
    with pytest.warns(UserWarning) as caught:
        study.optimize(guard.wrap_objective(lambda t: float(t.suggest_int("x", 1, 9))), n_trials=3)
    said = [w for w in caught if "nope" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__, [(w.filename, str(w.message)) for w in caught]
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert [(r.decision, r.reason) for r in _records(study)][1:] == [
        (
            Decision.UNCHECKED,
            "clamp names ['nope'] are not params of the search space ['x']: the trial runs unchecked under the monitor",
        )
    ] * 2
