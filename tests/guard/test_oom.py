"""Out of memory is infeasible, not a failure: real MemoryErrors, real torch OutOfMemoryErrors and a real kill by
the kernel's OOM killer end the trial PRUNED with a positive constraint, in process and in the runner, and the
study goes on. Real allocations, real SQLite storages, real child processes and a real cgroup."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import uuid
import weakref
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune import procfs
from optuna_memprune.guard import Decision, MemoryGuard, read_record
from optuna_memprune.guard._oom import killed_by_oom_killer, out_of_memory
from optuna_memprune.guard.backend import trials_of
from optuna_memprune.ledger import HostBudget, Ledger

import _oom_objectives as objectives

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[test]')")

HERE = Path(__file__).parent
MiB, GiB, PiB = 2**20, 2**30, 2**50
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.79 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 6.75 GiB memory in use."
)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _caught(call) -> BaseException:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test wants the real exception
        return exc
    raise AssertionError("no exception")


# -- the rule ------------------------------------------------------------------------------------------------


def test_real_out_of_memory_errors_are_recognised_with_the_size_they_asked_for() -> None:
    numpy_error = _caught(lambda: np.empty(1 << 50, dtype=np.uint8))
    oom = out_of_memory(numpy_error)
    assert isinstance(numpy_error, MemoryError) and type(numpy_error).__module__.startswith("numpy")
    assert oom is not None and oom.resource == "ram" and oom.requested == PiB  # from the array's shape and dtype
    # numpy shows its private subclass under its base's name
    assert oom.what.startswith("ran out of memory: MemoryError: Unable to allocate 1.00 PiB for an array")

    bare = out_of_memory(_caught(lambda: bytearray(1 << 60)))  # Python's own MemoryError, no text
    assert bare is not None and bare.resource == "ram" and bare.requested is None

    cuda = out_of_memory(torch.OutOfMemoryError(TORCH_OOM))
    assert cuda is not None and cuda.resource == "vram"
    assert cuda.requested == 2 * GiB and cuda.in_use == int(6.75 * GiB)
    assert out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory.")).resource == "vram"

    cpu = out_of_memory(_caught(lambda: torch.empty(1 << 50, dtype=torch.uint8)))  # torch's CPU allocator
    assert cpu is not None and cpu.resource == "ram" and cpu.requested == PiB

    old = out_of_memory(
        RuntimeError(
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.93 GiB total "
            "capacity; 7.26 GiB already allocated; 7.33 GiB reserved in total by PyTorch)"
        )
    )
    assert old is not None and old.resource == "vram" and old.requested == 20 * MiB and old.in_use == int(7.33 * GiB)

    try:  # raised from an out-of-memory error: counted
        try:
            np.empty(1 << 50, dtype=np.uint8)
        except MemoryError as exc:
            raise ValueError("the batch did not fit") from exc
    except ValueError as wrapped:
        assert out_of_memory(wrapped) is not None and out_of_memory(wrapped).resource == "ram"


def test_other_errors_are_not_out_of_memory() -> None:
    for exc in (
        ValueError("bad config"),
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("expected scalar type Float"),
        KeyError("x"),
        OSError(12, "out of memory?"),
    ):
        assert out_of_memory(exc) is None, exc
    assert out_of_memory(None, "ValueError: Unable to allocate nothing") is None
    assert out_of_memory(None, "RuntimeError: boom") is None


def test_an_exception_known_only_by_its_text_is_recognised() -> None:
    # what the runner gets back from a trial's process when the exception did not unpickle
    assert out_of_memory(None, "MemoryError: ").resource == "ram"
    numpy_error = _caught(lambda: np.empty(1 << 50, dtype=np.uint8))
    numpy_text = f"{type(numpy_error).__name__}: {numpy_error}"  # as the trial's process words it
    assert out_of_memory(None, numpy_text).requested == PiB
    assert out_of_memory(None, f"OutOfMemoryError: {TORCH_OOM}").resource == "vram"


def test_only_a_sigkill_while_the_oom_kill_count_rose_counts_as_the_oom_killer() -> None:
    now = procfs.oom_kills()
    if now is None:
        pytest.skip("/proc/vmstat has no oom_kill count on this kernel")
    assert killed_by_oom_killer(-9, now) is None  # SIGKILL, but no OOM kill since the launch's count
    assert killed_by_oom_killer(-9, None) is None  # no count at launch
    assert killed_by_oom_killer(-11, now - 1) is None  # the count rose, but SIGSEGV is never the OOM killer
    assert killed_by_oom_killer(None, now - 1) is None and killed_by_oom_killer(1, now - 1) is None
    oom = killed_by_oom_killer(-9, now - 1)
    assert oom is not None and oom.resource == "ram" and "OOM killer" in oom.what


# -- in process ---------------------------------------------------------------------------------------------


def _guard(**kw) -> MemoryGuard:
    return MemoryGuard(
        lambda p: omp.Footprint.of(ram=64 * MiB),
        kw.pop("budget", omp.Budget(ram="64GiB")),
        search_space={"oom": CategoricalDistribution([True, False])},
        **kw,
    )


def _in_process_study(tmp_path: Path, guard: MemoryGuard, n_trials: int = 3, name: str = "oom") -> optuna.Study:
    """Trial 0 runs out of memory (``oom=True``), the others do not."""
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'oom.db'}",
        study_name=name,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )
    study.enqueue_trial({"oom": True})
    for _ in range(n_trials - 1):
        study.enqueue_trial({"oom": False})
    return study


def _in_process(
    tmp_path: Path, guard: MemoryGuard, objective, n_trials: int = 3, name: str = "oom", **kw
) -> optuna.Study:
    study = _in_process_study(tmp_path, guard, n_trials, name)
    study.optimize(guard.wrap_objective(objective), n_trials=n_trials, **kw)
    return study


def test_in_process_a_memory_error_ends_pruned_with_a_positive_constraint_and_the_study_goes_on(tmp_path) -> None:
    held: list = []

    def objective(trial: optuna.Trial) -> float:
        block = np.ones(64 * MiB, dtype=np.uint8)  # what the trial holds when it runs out
        if trial.suggest_categorical("oom", [True, False]):
            held.append(weakref.ref(block))
            np.empty(1 << 50, dtype=np.uint8)
        return float(block[::4096].sum())

    guard = _guard()
    study = _in_process(tmp_path, guard, objective)
    oom, *rest = study.trials
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert record.reason.startswith("ran out of memory: MemoryError: Unable to allocate 1.00 PiB"), record.reason
    assert "memprune_ram counts it over the RAM budget" in record.reason
    assert record.peak_ram >= PiB  # what it held plus the 1 PiB it asked for
    assert oom.constraints["memprune_ram"] > 0 and record.constraints()["memprune_ram"] > 0
    assert [t.state for t in rest] == [TrialState.COMPLETE] * 2  # n_trials respected, nothing raised
    assert all(read_record(t.user_attrs).constraints()["memprune_ram"] <= 0 for t in rest)
    assert held[0]() is None  # the objective's arrays were let go with its frames, before any collection
    assert trials_of(guard).registered() == {} and trials_of(guard).running() == {}


def test_in_process_a_torch_out_of_memory_error_ends_pruned_whatever_catch_says(tmp_path) -> None:
    def objective(trial: optuna.Trial) -> float:
        if trial.suggest_categorical("oom", [True, False]):
            raise torch.OutOfMemoryError(TORCH_OOM)
        return 1.0

    guard = _guard(budget=omp.Budget(ram="64GiB", vram="4GiB"))
    study = _in_process(tmp_path, guard, objective, catch=(RuntimeError,))
    oom, *rest = study.trials
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert record.reason.startswith("ran out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert record.peak_vram == int(6.75 * GiB) + 2 * GiB  # what the process held plus what it asked for
    assert oom.constraints["memprune_vram"] > 0 and record.constraints()["memprune_vram"] > 0
    assert [t.state for t in rest] == [TrialState.COMPLETE] * 2

    # No VRAM budget: no memprune_vram constraint exists; still PRUNED, and the reason says so.
    guard = _guard()
    study = _in_process(tmp_path, guard, objective, name="no-vram-budget")
    oom = study.trials[0]
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert "no VRAM budget, so no memprune_vram constraint records it" in record.reason
    assert "memprune_vram" not in oom.constraints
    assert [t.state for t in study.trials[1:]] == [TrialState.COMPLETE] * 2


def test_in_process_other_errors_still_fail_and_stop_the_study(tmp_path) -> None:
    def objective(trial: optuna.Trial) -> float:
        if trial.suggest_categorical("oom", [True, False]):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return 1.0

    guard = _guard()
    study = _in_process_study(tmp_path, guard)
    with pytest.raises(RuntimeError, match="device-side assert"):
        study.optimize(guard.wrap_objective(objective), n_trials=3)
    assert [t.state for t in study.trials[:1]] == [TrialState.FAIL]  # the two enqueued after it never ran
    assert read_record(study.trials[0].user_attrs).decision is not Decision.OUT_OF_MEMORY


def test_in_process_a_trial_that_shared_its_process_still_gets_a_positive_constraint(tmp_path) -> None:
    both = threading.Barrier(2, timeout=60)  # the two trials run at the same time (n_jobs=2)

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("oom", [True, False])
        both.wait()
        if trial.number == 0:  # not an enqueued param: two threads may both pop one enqueued trial
            np.empty(1 << 50, dtype=np.uint8)
        return 1.0

    guard = _guard()
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'oom.db'}", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
    )
    with pytest.warns(UserWarning, match="threads of one process"):
        study.optimize(guard.wrap_objective(objective), n_trials=2, n_jobs=2)
    oom, ok = sorted(study.trials, key=lambda t: t.number)
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert "other trials ran in this process" in record.reason  # its peaks are the process's
    assert oom.constraints["memprune_ram"] > 0  # as written on the trial (the record read back has no concurrency)
    assert ok.state is TrialState.COMPLETE and ok.constraints["memprune_ram"] <= 0


def test_in_process_out_of_memory_handling_imports_no_torch() -> None:
    code = (
        "import sys, numpy as np, optuna, optuna_memprune as omp\n"
        "optuna.logging.set_verbosity(optuna.logging.WARNING)\n"
        "g = omp.MemoryGuard(lambda p: omp.Footprint.of(ram=2**26), omp.Budget(ram='64GiB'))\n"
        "s = optuna.create_study(sampler=g.wrap_sampler(optuna.samplers.RandomSampler()))\n"
        "s.optimize(g.wrap_objective(lambda t: t.suggest_float('x', 0, 1) + np.empty(1 << 50).sum()), n_trials=2)\n"
        "print([t.state.name for t in s.trials], 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['PRUNED', 'PRUNED'] False"


# -- in the runner ------------------------------------------------------------------------------------------


def _runner_study(tmp_path: Path, guard: MemoryGuard) -> optuna.Study:
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )
    study.enqueue_trial({"oom": True})
    study.enqueue_trial({"oom": False})
    return study


def _host(tmp_path: Path, gpus: list | None = None) -> Ledger:
    return Ledger(
        HostBudget(ram="8GiB", gpus=gpus, headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )


def _runner_guard(**budget) -> MemoryGuard:
    footprint = objectives.footprint
    if "vram" in budget:
        footprint = functools.partial(_with_vram, footprint)
    return MemoryGuard(
        footprint, omp.Budget(ram="2GiB", **budget), search_space={"oom": CategoricalDistribution([True, False])}
    )


def _with_vram(footprint, params: dict) -> omp.Footprint:
    return footprint(params) + omp.Footprint.of(vram=GiB)


@pytest.mark.slow
def test_runner_a_memory_error_ends_pruned_with_a_positive_constraint_and_the_run_goes_on(tmp_path) -> None:
    guard = _runner_guard()
    study = _runner_study(tmp_path, guard)
    omp.optimize(study, objectives.numpy_oom, guard=guard, n_trials=3, host=_host(tmp_path))  # no catch=
    oom, *rest = study.trials
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert record.reason.startswith("ran out of memory: MemoryError: Unable to allocate 1.00 PiB"), record.reason
    assert record.peak_ram >= PiB and oom.constraints["memprune_ram"] > 0
    assert [t.state for t in rest] == [TrialState.COMPLETE] * 2 and len(study.trials) == 3
    study.enqueue_trial({"oom": True})  # listed in catch=: still infeasible, not a failure
    omp.optimize(study, objectives.numpy_oom, guard=guard, n_trials=1, catch=(MemoryError,), host=_host(tmp_path))
    assert study.trials[-1].state is TrialState.PRUNED
    assert read_record(study.trials[-1].user_attrs).decision is Decision.OUT_OF_MEMORY


@pytest.mark.slow
def test_runner_a_torch_out_of_memory_error_ends_pruned_with_or_without_a_vram_budget(tmp_path) -> None:
    guard = _runner_guard(vram="4GiB")
    study = _runner_study(tmp_path, guard)
    omp.optimize(study, objectives.torch_oom, guard=guard, n_trials=3, host=_host(tmp_path, gpus=["8GiB"]))
    oom, *rest = study.trials
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY
    assert "OutOfMemoryError: CUDA out of memory" in record.reason
    assert record.peak_vram == int(6.75 * GiB) + 2 * GiB and oom.constraints["memprune_vram"] > 0
    assert [t.state for t in rest] == [TrialState.COMPLETE] * 2

    (tmp_path / "novram").mkdir()
    guard = _runner_guard()
    study = _runner_study(tmp_path / "novram", guard)
    omp.optimize(study, objectives.torch_oom, guard=guard, n_trials=2, host=_host(tmp_path / "novram"))
    oom, ok = study.trials
    assert oom.state is TrialState.PRUNED and "no VRAM budget" in read_record(oom.user_attrs).reason
    assert ok.state is TrialState.COMPLETE


def _memory_cgroup_v1() -> Path | None:
    """This process's cgroup v1 memory group, where this process may create a child group (root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (group / "memory.limit_in_bytes").exists() and os.access(group, os.W_OK):
                return group
    return None


@pytest.mark.slow
def test_runner_a_trial_killed_by_the_kernels_oom_killer_ends_pruned_and_the_run_goes_on(tmp_path, monkeypatch) -> None:
    parent = _memory_cgroup_v1()
    if parent is None or procfs.oom_kills() is None:
        pytest.skip(
            "needs a writable cgroup v1 memory controller (root) and /proc/vmstat's oom_kill count, to "
            "have the kernel's OOM killer kill a trial without starving the host"
        )
    group = parent / f"memprune-test-oom-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(64 * MiB))
        if (group / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the limit
            (group / "memory.memsw.limit_in_bytes").write_text(str(64 * MiB))
        monkeypatch.setenv("MEMPRUNE_TEST_CGROUP", str(group))
        guard = _runner_guard()
        study = _runner_study(tmp_path, guard)
        before = procfs.oom_kills()
        # polling: the trial's process leaves its own group below, so only the host's count can tell
        omp.optimize(study, objectives.cgroup_oom, guard=guard, n_trials=3, host=_host(tmp_path), enforce="polling")
        assert (
            int(dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())["oom_kill"]) == 1
            and procfs.oom_kills() > before
        )  # the kernel did kill it
    finally:
        group.rmdir()
    oom, *rest = study.trials
    record = read_record(oom.user_attrs)
    assert oom.state is TrialState.PRUNED and record.decision is Decision.OUT_OF_MEMORY, record.reason
    assert record.reason.startswith("killed by the kernel's OOM killer (SIGKILL while the host's OOM kill count rose")
    assert record.peak_ram > 2 * GiB and oom.constraints["memprune_ram"] > 0  # over its budget
    assert [t.state for t in rest] == [TrialState.COMPLETE] * 2


@pytest.mark.slow
def test_runner_with_a_cgroup_a_sigkill_from_outside_is_not_taken_for_another_processes_oom_kill(
    tmp_path, monkeypatch
) -> None:
    from optuna_memprune import cgroups

    parent, (where, why) = _memory_cgroup_v1(), cgroups.place()
    if parent is None or where is None or not where.memory or procfs.oom_kills() is None:
        pytest.skip(f"needs a writable cgroup v1 memory controller (root) for the test's group and the trial's: {why}")
    group = parent / f"memprune-test-oom-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(64 * MiB))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(64 * MiB))
        monkeypatch.setenv("MEMPRUNE_TEST_CGROUP", str(group))
        guard = _runner_guard()
        study = _runner_study(tmp_path, guard)
        before = procfs.oom_kills()
        omp.optimize(
            study, objectives.oom_elsewhere_then_killed, guard=guard, n_trials=2, host=_host(tmp_path), enforce="cgroup"
        )
        assert procfs.oom_kills() > before  # the host's count rose while the trial ran
    finally:
        group.rmdir()
    killed, after = study.trials
    record = read_record(killed.user_attrs)
    assert killed.state is TrialState.FAIL and record.decision is not Decision.OUT_OF_MEMORY, record.reason
    assert "died from signal SIGKILL (sent from outside the runner" in record.reason
    assert str(record.enforcement) == "cgroup v1 limit" and after.state is TrialState.COMPLETE
