"""The Ray backend of ``omp.optimize`` on a real Ray cluster started here (``ray.cluster_utils.Cluster``: a head
node, and a second node the node-death test adds and kills), real allocations and a real SQLite storage.

One cluster for the module (starting one takes 10-20 s on 2 cores); its head offers 2 CPUs and 600 MiB of
Ray's ``memory`` resource, a logical figure that decides where a trial can go.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune.cli import main
from optuna_memprune.ledger import HostBudget, Ledger
from optuna_memprune.runner._ray_nodes import Ask, Node, ask_for, misfit

import _ray_objectives as objectives

HERE = Path(__file__).parent
MiB, GiB = 2**20, 2**30
HEAD_MEMORY = 600 * MiB
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[test]')")
    from ray.cluster_utils import Cluster

    fast_health = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "memory": HEAD_MEMORY,
            "object_store_memory": 80 * MiB,
            "include_dashboard": False,
            "_system_config": fast_health,
        },
    )
    # the workers import this directory's objectives, as a user's cluster has the user's code installed
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}}, logging_level="warning")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")  # else a later ray.init() on this machine looks for it
        if current.is_file() and current.read_text().strip() == cluster.address:
            current.unlink()


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path: Path, guard: omp.MemoryGuard, name: str = "s") -> optuna.Study:
    return optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name=name,
        load_if_exists=True,
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )


def _space(**extra: optuna.distributions.BaseDistribution) -> dict:
    return {"mb": optuna.distributions.IntDistribution(8, 3000), **extra}


def _record(trial: optuna.trial.FrozenTrial) -> omp.guard.TrialRecord:
    record = omp.read_record(trial.user_attrs)
    assert record is not None, f"trial {trial.number} has no record"
    return record


def test_trials_run_as_ray_tasks_and_one_over_its_budget_is_stopped_with_the_reading(
    cluster: object, tmp_path: Path
) -> None:
    space = _space(grow=optuna.distributions.CategoricalDistribution([False, True]))
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="500MiB"), search_space=space)
    study = _study(tmp_path, guard)
    for params in ({"mb": 40, "grow": False}, {"mb": 60, "grow": False}, {"mb": 8, "grow": True}):
        study.enqueue_trial(params)
    omp.optimize(study, objectives.hold_or_grow, guard=guard, n_trials=3, n_jobs=2, backend="ray")
    held, held2, stopped = study.trials
    for t in (held, held2):
        record = _record(t)
        assert t.state is TrialState.COMPLETE and record.decision.value == "admitted", record.reason
        assert t.intermediate_values == {0: float(t.params["mb"])}  # report() went through the storage
        assert t.params["mb"] * MiB < record.peak_ram < 500 * MiB  # the trial's own process, watched
        assert record.margin == {"ram": 1.25} and record.host == socket.gethostname()
        assert str(record.enforcement) == "polling" and record.timeline
    # the two ran at the same time (two tasks of 237.5 MiB fit the head's 600 MiB), each from a fresh worker
    (a0, a1), (b0, b1) = held.user_attrs["ran"], held2.user_attrs["ran"]
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    assert held.user_attrs["parent"] != held2.user_attrs["parent"] != os.getpid()
    record = _record(stopped)
    assert stopped.state is TrialState.PRUNED and record.decision.value == "stopped", record.reason
    assert "over the budget" in record.reason and record.breach["rss"] > 500 * MiB
    assert 500 * MiB <= record.peak_ram < 1500 * MiB and 0 <= record.breach["stop_ms"] < 2000
    assert record.constraints()["memprune_ram"] > 0
    assert not study.get_trials(states=(TrialState.RUNNING,))
    # the record has the local runner's shape: the same attrs, written by the same code
    local = _study(tmp_path, guard, name="local")
    local.enqueue_trial({"mb": 40, "grow": False})
    ledger = Ledger(HostBudget(ram="4GiB", gpus=None, headroom=0.0), url=f"sqlite:///{tmp_path / 'l.sqlite'}")
    omp.optimize(local, objectives.hold_or_grow, guard=guard, n_trials=1, host=ledger, enforce="polling")
    ledger.close()
    assert sorted(local.trials[0].user_attrs) == sorted(held.user_attrs)
    assert _record(local.trials[0]).margin == record.margin and local.trials[0].state is TrialState.COMPLETE


def test_a_trial_asked_while_a_task_runs_whose_end_completes_the_warm_up_waits_for_it(
    cluster: object, tmp_path: Path
) -> None:
    # as the local runner does (tests/guard/test_learned_guard.py): two recorded trials over the line, warmup=3;
    # a 40 MiB trial runs 4 s in the warm-up, the trial asked meanwhile waits for its end and is decided on the
    # bound, and the last 40 MiB trial, covered by the long one, is admitted
    from optuna_memprune.records import Decision, TrialRecord

    import _learned_objectives as learned

    guard = omp.MemoryGuard(None, omp.Budget(ram="500MiB"), learn=omp.estimate.learned(warmup=3))
    study = _study(tmp_path, guard)
    mb = optuna.distributions.IntDistribution(8, 480, log=True)
    for size, peak in ((10, 470), (12, 480)):
        record = TrialRecord(Decision.ADMITTED, peak_ram=peak * MiB, budget_ram=500 * MiB, soft=0.9)
        study.add_trial(
            optuna.trial.create_trial(
                params={"mb": size}, distributions={"mb": mb}, value=0.0, user_attrs=record.attrs()
            )
        )
    for params in ({"mb": 40, "seed": 1}, {"mb": 8, "seed": 0}, {"mb": 40, "seed": 2}):
        study.enqueue_trial(params)
    omp.optimize(study, learned.alloc_held, guard=guard, n_trials=3, n_jobs=2, backend="ray")
    long, waited, last = (_record(t) for t in study.trials[2:])
    assert long.learned["phase"] == "warm-up" and waited.learned["phase"] == "bound", waited.reason
    assert "checked again once a running trial ended (first: learned footprint warming up" in waited.reason
    assert study.trials[4].state is TrialState.COMPLETE and last.decision is Decision.ADMITTED, last.reason
    assert last.learned["phase"] == "bound"


def test_a_trial_no_node_can_ever_hold_is_rejected_with_the_reason_before_it_is_submitted(
    cluster: object, tmp_path: Path
) -> None:
    space = _space(threads=optuna.distributions.IntDistribution(1, 8))
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="3GiB", threads=8), search_space=space)
    study = _study(tmp_path, guard)
    study.enqueue_trial({"mb": 2000, "threads": 1})  # (150 + 2000) MiB x 1.25 > the head's 600 MiB
    study.enqueue_trial({"mb": 8, "threads": 6})  # 6 threads x 1.25 -> 8 CPUs > the head's 2
    started = time.monotonic()
    omp.optimize(study, objectives.hold, guard=guard, n_trials=2, backend="ray")
    assert time.monotonic() - started < 15  # nothing waited for resources that never come
    too_big, too_many = study.trials
    for t in (too_big, too_many):
        assert t.state is TrialState.PRUNED and _record(t).decision.value == "rejected"
        assert t.params == {"mb": t.params["mb"], "threads": t.params["threads"]}  # the whole known space
        assert _record(t).reason.startswith("no node of the Ray cluster can ever run it: it asks memory ")
    assert "2.62 GiB, 2 CPUs, 0 GPUs, more than any alive node" in _record(too_big).reason  # ceil(1 x 1.25) CPUs
    assert "memory 600.00 MiB, 2 CPUs, 0 GPUs" in _record(too_big).reason
    assert ", 8 CPUs, 0 GPUs, more than" in _record(too_many).reason


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # retried_trial_number
def test_a_dead_node_fails_its_trial_with_the_reason_and_the_retry_no_node_can_hold_is_rejected(
    cluster: object, tmp_path: Path
) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="1GiB"), search_space=_space())
    study = _study(tmp_path, guard)
    study.enqueue_trial({"mb": 500})  # (150 + 500) MiB x 1.25: only the second node's 1 GiB holds it
    study.enqueue_trial({"mb": 8})  # fits the head
    node = cluster.add_node(num_cpus=1, memory=GiB, object_store_memory=80 * MiB)  # type: ignore[attr-defined]
    killed: list[float] = []

    def kill_the_node_once_the_trial_runs() -> None:
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            trials = storage.get_all_trials(storage.get_study_id_from_name("s"))
            if trials and trials[0].intermediate_values:
                cluster.remove_node(node, allow_graceful=False)  # type: ignore[attr-defined]
                killed.append(time.monotonic())
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_the_node_once_the_trial_runs)
    killer.start()
    omp.optimize(study, objectives.hold_long, guard=guard, n_trials=3, backend="ray", ray_retries=1)
    ended = time.monotonic()
    killer.join()
    assert killed and ended - killed[0] < 45  # the study went on at once, not after the trial's minute
    lost, small, retry = study.trials
    record = _record(lost)
    assert lost.state is TrialState.FAIL and record.decision.value == "admitted"
    assert "; its Ray task was lost: " in record.reason and "Error" in record.reason, record.reason
    assert small.state is TrialState.COMPLETE
    assert optuna.storages.RetryFailedTrialCallback.retried_trial_number(retry) == lost.number
    assert retry.params == lost.params and retry.state is TrialState.PRUNED
    assert _record(retry).reason.startswith("no node of the Ray cluster can"), _record(retry).reason
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


def test_a_driver_restarted_on_the_storage_by_memprune_worker_fails_the_trials_its_dead_predecessor_left_running(
    cluster: object, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=url)
    # a real driver asks a trial as the Ray driver asks it (marked with its identity) and is killed
    code = (
        "import os, socket, optuna\n"
        "from optuna_memprune import _internals\n"
        "from optuna_memprune.runner._owners import RUNNER, runner_mark\n"
        f"study = optuna.load_study(study_name='s', storage={url!r})\n"
        "_internals.ask_marked(study, {RUNNER: runner_mark(socket.gethostname())})\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert died.returncode == -9, died.stderr
    study = optuna.load_study(study_name="s", storage=url)
    assert study.trials[0].state is TrialState.RUNNING
    study.enqueue_trial({"mb": 8})
    # the restarted driver is `memprune worker --ray`: the cluster's address (this process is connected already)
    worker = ["worker", "_ray_objectives:hold", "--storage", url, "--study", "s", "--footprint"]
    worker += ["_ray_objectives:footprint", "--ram", "500MiB", "--sampler", "random", "--n-trials", "1"]
    assert main([*worker, "--ray", cluster.address]) == 0  # type: ignore[attr-defined]
    left, ran = study.trials
    assert left.state is TrialState.FAIL and ran.state is TrialState.COMPLETE
    assert _record(left).reason == (
        f"its runner (pid {int(died.stdout)} on host {socket.gethostname()}) died before the trial ended"
    )


def test_memprune_run_with_ray_runs_an_unchanged_programs_trials_as_ray_tasks(cluster: object, tmp_path: Path) -> None:
    program = tmp_path / "search.py"
    program.write_text(
        "import time, numpy as np, optuna\n"
        "def objective(trial):\n"
        "    block = np.ones(trial.suggest_int('mb', 8, 64) * 2**20, dtype=np.uint8)\n"
        "    time.sleep(0.5)\n"
        "    return float(block[0])\n"
        f"study = optuna.create_study(storage='sqlite:///{tmp_path / 'study.db'}', study_name='s')\n"
        "study.optimize(objective, n_trials=1)\n"
    )
    run = [sys.executable, "-m", "optuna_memprune.cli", "run", "--ray", cluster.address]  # type: ignore[attr-defined]
    out = subprocess.run(
        [*run, "--ram", "500MiB", "--footprint", "none", "--", sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert f"memprune: trials run as Ray tasks on the cluster at {cluster.address} (1 at a time;" in out.stderr  # type: ignore[attr-defined]
    (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    record = _record(trial)
    assert trial.state is TrialState.COMPLETE and record.decision.value == "unchecked"
    assert record.host == socket.gethostname() and str(record.enforcement) == "polling"
    assert record.peak_ram > trial.params["mb"] * MiB


def test_an_objective_the_nodes_cannot_import_fails_its_trial_and_stops_the_run_saying_why(
    cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "only_here.py").write_text("def objective(trial):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver imports it; the cluster's workers cannot
    import only_here  # type: ignore[import-not-found]

    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="500MiB"), search_space=_space())
    study = _study(tmp_path, guard)
    with pytest.raises(RuntimeError, match=r"^Trial 0: its Ray task failed: .*No module named 'only_here'\. Each task"):
        omp.optimize(study, only_here.objective, guard=guard, n_trials=3, backend="ray")
    (trial,) = study.trials  # the run stopped after it
    assert trial.state is TrialState.FAIL and "its Ray task failed: " in _record(trial).reason


# -- without a cluster ------------------------------------------------------------------------------------


def test_bad_backend_arguments_are_refused_naming_the_argument(tmp_path: Path) -> None:
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="500MiB"))
    study = _study(tmp_path, guard)
    with pytest.raises(ValueError, match=r"^backend must be 'local' .* or 'ray' .*, but got 'dask'\.$"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, backend="dask")
    with pytest.raises(ValueError, match=r"^ray_address= is for backend='ray'"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, ray_address="auto")
    with pytest.raises(ValueError, match=r"^ray_retries must be a non-negative int, but got -1\.$"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, backend="ray", ray_retries=-1)
    with pytest.raises(ValueError, match=r"^host= is the local runner's ledger"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, backend="ray", host=HostBudget())
    with pytest.raises(ValueError, match=r"^enforce must be 'auto' or 'polling' with backend='ray'"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, backend="ray", enforce="cgroup")
    in_memory = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()))
    with pytest.raises(ValueError, match="in-memory study"):
        omp.optimize(in_memory, objectives.hold, guard=guard, n_trials=1, backend="ray")
    assert study.trials == [] and in_memory.trials == []


def test_memprune_worker_with_ray_refuses_this_hosts_ledger_options(tmp_path: Path, capsys) -> None:
    worker = ["worker", "_ray_objectives:hold", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "s"]
    worker += ["--footprint", "_ray_objectives:footprint", "--ram", "500MiB", "--ray", "auto"]
    assert main([*worker, "--host-ram", "4GiB", "--on-host-full", "reject"]) == 2
    assert capsys.readouterr().err == (
        "memprune: error: --host-ram, --on-host-full are for this host's ledger; with --ray the cluster admits "
        "each trial by its Ray resources: leave them out\n"
    )
    assert main([*worker, "--ray-retries", "-1"]) == 2
    assert "--ray-retries must be a non-negative int, but got -1" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()  # refused before the study was made


def test_without_ray_the_call_names_the_ray_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna_memprune._extras import MissingExtra

    monkeypatch.setitem(sys.modules, "ray", None)  # as where the extra is not installed
    guard = omp.MemoryGuard(objectives.footprint, omp.Budget(ram="500MiB"))
    study = _study(tmp_path, guard)
    with pytest.raises(MissingExtra) as raised:
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, backend="ray")
    assert str(raised.value) == (
        "optimize(backend='ray') needs ray, which is not installed: pip install \"optuna-memprune[ray]\""
    )
    assert study.trials == []


def test_a_trials_ray_resources_follow_its_reservation() -> None:
    cpu_node = Node("a", "10.0.0.1", memory=8 * GiB, cpus=8, gpus=0)
    gpu_node = Node("b", "10.0.0.2", memory=32 * GiB, cpus=16, gpus=2)
    figures = {"ram": 2 * GiB, "vram": 6 * GiB, "threads": 12}
    # VRAM as a fraction of the smallest GPU, rounded up to Ray's precision; one CPU without a thread budget
    ask = ask_for(figures, threads_budgeted=False, unchecked=False, nodes=[cpu_node, gpu_node], gpu_memory=24 * GiB)
    assert ask == Ask(memory=2 * GiB, num_cpus=1.0, num_gpus=0.25)
    assert ask.options() == {"num_cpus": 1.0, "num_gpus": 0.25, "memory": 2 * GiB}
    assert misfit(ask, [cpu_node, gpu_node], 24 * GiB) == "" and not cpu_node.holds(ask)
    # a whole GPU where its memory is unknown; the reserved threads as CPUs under a thread budget
    ask = ask_for(figures, threads_budgeted=True, unchecked=False, nodes=[cpu_node, gpu_node], gpu_memory=None)
    assert (ask.num_gpus, ask.num_cpus) == (1.0, 12.0)
    # a cluster without GPUs runs it on CPUs; an unchecked trial's budget is capped at the largest node
    ask = ask_for({"ram": 64 * GiB, "vram": 8 * GiB, "threads": 32}, threads_budgeted=True, unchecked=True,
                  nodes=[cpu_node], gpu_memory=None)  # fmt: skip
    assert ask == Ask(memory=8 * GiB, num_cpus=8.0, num_gpus=0.0) and misfit(ask, [cpu_node], None) == ""
    # more VRAM than one GPU has never fits, whatever the GPU count
    ask = ask_for(figures, threads_budgeted=False, unchecked=False, nodes=[gpu_node], gpu_memory=4 * GiB)
    assert ask.num_gpus == 1.5
    assert misfit(ask, [gpu_node], 4 * GiB).endswith(
        "its VRAM is more than a GPU of the Ray cluster holds (4.00 GiB, the smallest)"
    )
    assert misfit(Ask(memory=GiB), [], None).endswith("more than any alive node of the Ray cluster has in all (none)")
