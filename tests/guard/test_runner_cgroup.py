"""The runner's cgroup per trial (``optimize(enforce=...)``), with real groups of this machine, real child
processes and a real SQLite storage; skipped, with the reason, where this host gives no group."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import optuna_memprune as omp
from optuna_memprune import cgroups, procfs
from optuna_memprune.ledger import HostBudget, Ledger
from optuna_memprune.records import Enforcement, EnforcementMode

import _cgroup_objectives as cg_objectives
import _runner_objectives as objectives

MiB = 2**20
pytestmark = pytest.mark.slow
PLACE, WHY = cgroups.place()
needs_group = pytest.mark.skipif(PLACE is None, reason=f"no cgroup can be made here: {WHY}")
needs_limit = pytest.mark.skipif(
    PLACE is None or not PLACE.memory, reason=f"no cgroup with a memory controller here: {WHY or PLACE and PLACE.label}"
)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _setup(tmp_path: Path, ram: str) -> tuple[omp.MemoryGuard, optuna.Study, Ledger]:
    space = {"mb": optuna.distributions.IntDistribution(8, 16)}
    guard = omp.MemoryGuard(functools.partial(objectives.footprint, base=100), omp.Budget(ram=ram), search_space=space)
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name="s",
        sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)),
        pruner=guard.wrap_pruner(None),
    )
    ledger = Ledger(
        HostBudget(ram="8GiB", gpus=None, headroom=0.0), url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", host="test-host"
    )
    return guard, study, ledger


def _record(trial: optuna.trial.FrozenTrial) -> omp.guard.TrialRecord:
    record = omp.read_record(trial.user_attrs)
    assert record is not None, f"trial {trial.number} has no record"
    return record


def _limit() -> Enforcement:
    """The record's enforcement of a trial held by its cgroup's limit on this host."""
    assert PLACE is not None
    return Enforcement(EnforcementMode.CGROUP_LIMIT, cgroup_version=PLACE.version)


def _own_groups() -> list[str]:
    return [n for n in os.listdir(PLACE.path) if n.startswith(f"memprune-{os.getpid()}-")] if PLACE else []


@needs_limit
def test_a_burst_faster_than_the_poll_is_stopped_by_the_kernel_at_the_budget_and_the_study_goes_on(
    tmp_path: Path,
) -> None:
    budget = 400 * MiB
    guard, study, ledger = _setup(tmp_path, "400MiB")
    omp.optimize(
        study,
        functools.partial(cg_objectives.burst, nbytes=3 * budget),
        guard=guard,
        n_trials=1,
        host=ledger,
        enforce="cgroup",
    )
    omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1, host=ledger)
    burst, after = study.trials
    record = _record(burst)
    assert burst.state is TrialState.PRUNED and record.decision.value == "stopped"
    assert record.reason == "stopped by the kernel at its cgroup limit (400 MiB)"
    assert record.enforcement == _limit() and str(record.enforcement) == f"cgroup v{PLACE.version} limit"
    assert budget <= record.peak_ram <= 1.02 * budget  # the exact peak: not 3x the budget
    assert record.constraints()["memprune_ram"] > 0  # the sampler learns the region is infeasible
    assert after.state is TrialState.COMPLETE and _record(after).enforcement == _limit()
    assert _record(after).peak_ram < budget
    assert _own_groups() == [] and ledger.entries() == []


@needs_limit
def test_the_page_cache_a_trial_leaves_is_not_its_peak_ram(tmp_path: Path) -> None:
    # room for the whole cache under the limit: cache the kernel reclaims during the trial (at the limit, or
    # for a loaded host) is in the group's peak but no longer charged at the end, and would count as RAM
    guard, study, ledger = _setup(tmp_path, "1GiB")
    omp.optimize(
        study,
        functools.partial(cg_objectives.write_file, path=str(tmp_path / "data"), mib=300),
        guard=guard,
        n_trials=1,
        host=ledger,
    )
    (trial,) = study.trials
    record = _record(trial)
    assert trial.state is TrialState.COMPLETE and record.enforcement == _limit()
    # its RSS, as polled (what the process forked for it holds depends on the test process: 74 MiB alone,
    # 198 after a torch test here, 257 in a suite run); the 300 MiB of page cache it wrote are not counted
    polled = max(p[1] for p in record.timeline if p[1] is not None)
    assert record.peak_ram < polled + 64 * MiB, (record.peak_ram / MiB, polled / MiB)
    assert record.constraints()["memprune_ram"] < 0


@needs_group
def test_a_grandchild_ignoring_sigterm_whose_parent_died_first_is_gone_after_the_trial(tmp_path: Path) -> None:
    guard, study, ledger = _setup(tmp_path, "2GiB")
    marker = tmp_path / "grandchild"
    omp.optimize(
        study, functools.partial(cg_objectives.orphan, marker=str(marker)), guard=guard, n_trials=1, host=ledger
    )
    (trial,) = study.trials
    assert trial.state is TrialState.COMPLETE, _record(trial).reason
    enforcement = _record(trial).enforcement
    assert enforcement.mode is not EnforcementMode.POLLING and enforcement.cgroup_version == PLACE.version, enforcement
    pid, start = map(int, marker.read_text().split())
    try:
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
        alive = fields[0] not in (b"Z", b"X") and int(fields[19]) == start
    except OSError:
        alive = False
    assert not alive, f"the grandchild {pid} outlived its trial"
    assert _own_groups() == []


def test_polling_keeps_the_watchdog_alone_and_says_so(tmp_path: Path) -> None:
    guard, study, ledger = _setup(tmp_path, "700MiB")
    omp.optimize(study, objectives.grow, guard=guard, n_trials=1, host=ledger, enforce="polling")
    omp.optimize(
        study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1, host=ledger, enforce="polling"
    )
    stopped, after = study.trials
    record = _record(stopped)
    assert stopped.state is TrialState.PRUNED and record.decision.value == "stopped"
    assert record.reason.startswith("stopped by the runner: ") and "over the budget" in record.reason
    polling = Enforcement(EnforcementMode.POLLING)
    assert record.enforcement == polling and _record(after).enforcement == polling
    assert after.user_attrs["memprune:enforcement"] == "polling"  # the text stored, as before the type
    assert after.state is TrialState.COMPLETE
    assert _own_groups() == []


def test_enforce_is_checked_before_any_trial(tmp_path: Path) -> None:
    guard, study, ledger = _setup(tmp_path, "700MiB")
    with pytest.raises(ValueError, match=r"^enforce must be 'auto' .* but got 'kernel'\.$"):
        omp.optimize(study, objectives.hold, guard=guard, n_trials=1, host=ledger, enforce="kernel")
    assert study.trials == []


_NO_CGROUP = """
import functools, sys
import optuna
import optuna_memprune as omp
from optuna_memprune.ledger import HostBudget, Ledger
import _runner_objectives as objectives

optuna.logging.set_verbosity(optuna.logging.WARNING)
d = sys.argv[1]
guard = omp.MemoryGuard(functools.partial(objectives.footprint, base=100), omp.Budget(ram="700MiB"),
                        search_space={"mb": optuna.distributions.IntDistribution(8, 16)})
study = optuna.create_study(storage=f"sqlite:///{d}/study.db", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
                            pruner=guard.wrap_pruner(None))
ledger = Ledger(HostBudget(ram="8GiB", gpus=None, headroom=0.0), url=f"sqlite:///{d}/ledger.sqlite", host="h")
try:
    omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1, host=ledger,
                 enforce="cgroup")
except omp.EnforcementError as exc:  # a MemPruneError: the CLI prints its one line, exit 1
    print("refused:", exc)
print("trials:", len(study.trials))
omp.optimize(study, functools.partial(objectives.hold, seconds=0.0), guard=guard, n_trials=1, host=ledger)
(trial,) = study.trials
print("auto:", trial.state.name, omp.read_record(trial.user_attrs).enforcement)
"""


# Runs the script below with every cgroup hierarchy mounted read-only in a mount namespace of its own, as a
# container's runtime mounts them by default: no group can be made there.
_READ_ONLY = (
    "mount --make-rprivate / && for m in $(awk '$9 ~ /^cgroup/ {print $5}' /proc/self/mountinfo); "
    'do mount -o remount,bind,ro "$m" || exit 97; done && exec "$0" "$@"'
)


def test_where_no_group_can_be_made_cgroup_is_refused_before_any_trial_and_auto_polls(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        pytest.skip("needs root with unshare and mount, to mount the cgroup hierarchies read-only for one process")
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{here.parent.parent}{os.pathsep}{here}"}
    run = subprocess.run(
        ["unshare", "-m", "sh", "-c", _READ_ONLY, sys.executable, "-c", _NO_CGROUP, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode == 97 or (run.returncode != 0 and "unshare" in run.stderr):
        pytest.skip(f"the cgroup hierarchies cannot be mounted read-only here: {run.stderr.strip()}")
    out = run.stdout
    assert run.returncode == 0, run.stderr
    assert "refused: enforce='cgroup', but no cgroup can be made for the trials here: " in out, out
    assert "Read-only file system" in out and "trials: 0" in out
    assert "auto: COMPLETE polling" in out
