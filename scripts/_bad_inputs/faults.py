"""Fault scenarios of the bad-input probe: several processes, killed or interrupted from outside.

Each runs in the case's directory, relays what its commands printed to stderr (so a traceback in any of
them shows), writes what it measured to ``facts.json`` for the probe's post-conditions, and exits with the
status the case is judged on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

WORKER = ["worker", "--n-trials", "1", "--no-progress"]
GUARD = ["--footprint", "_bad_inputs.objectives:footprint", "--ram", "1GiB"]


def _facts(**facts) -> None:
    old = json.loads(Path("facts.json").read_text()) if Path("facts.json").exists() else {}
    Path("facts.json").write_text(json.dumps({**old, **facts}))


def _start(*args: str, marker: str | None = None, session: bool = False) -> subprocess.Popen:
    env = dict(os.environ)
    if marker:
        env["PROBE_MARKER"] = str(Path(marker).resolve())
    return subprocess.Popen(
        [sys.executable, "-m", "optuna_memprune.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=session,
    )


def _finish(proc: subprocess.Popen, timeout: float = 40) -> int:
    """Wait for ``proc``, relay its output, return its status (killed and -9 when it outlives ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n[probe] {' '.join(proc.args[3:5])} did not exit within {timeout:.0f} s: killed\n"
    sys.stdout.write(out)
    sys.stderr.write(err)
    return proc.returncode


def _run(*args: str, timeout: float = 40) -> int:
    return _finish(_start(*args), timeout)


def _wait_for(marker: str, proc: subprocess.Popen, timeout: float = 30) -> int:
    """The pid the trial wrote to ``marker``; raises when the trial never started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(marker).exists():
            return int(Path(marker).read_text())
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    _finish(proc, 5)
    raise RuntimeError(f"the scenario's trial never started (marker {marker})")


def worker_killed_then_rerun(*, other_storage_between: bool) -> None:
    """A runner SIGKILLed mid-trial, (another storage's runner on the same host ledger,) then its own study
    run again: its trial #0 must end FAIL, never stay RUNNING."""
    victim = _start(
        *WORKER,
        "_bad_inputs.objectives:wait_to_be_killed",
        "--storage",
        "sqlite:///c.db",
        "--study",
        "c",
        *GUARD,
        marker="c.pid",
    )
    _wait_for("c.pid", victim)
    victim.kill()
    _finish(victim)
    if other_storage_between:
        _run(*WORKER, "_bad_inputs.objectives:quick", "--storage", "sqlite:///b.db", "--study", "b", *GUARD)
    sys.exit(_run(*WORKER, "_bad_inputs.objectives:quick", "--storage", "sqlite:///c.db", "--study", "c", *GUARD))


def slow_footprint_then_killed() -> None:
    """A footprint that sleeps 30 s, a trial (unchecked: no search space yet) whose objective returned, its
    runner SIGKILLed 3 s later, then the study run again with a fast footprint: nothing may stay RUNNING."""
    victim = _start(
        *WORKER,
        "_bad_inputs.objectives:mark_and_return",
        "--storage",
        "sqlite:///study.db",
        "--study",
        "s",
        "--guard",
        "_bad_inputs.objectives:make_slow_guard",
        marker="t.pid",
    )
    _wait_for("t.pid", victim, timeout=45)
    time.sleep(3)  # the objective has returned; the runner is in its bookkeeping
    victim.kill()
    _finish(victim)
    sys.exit(
        _run(
            *WORKER,
            "_bad_inputs.objectives:quick",
            "--storage",
            "sqlite:///study.db",
            "--study",
            "s",
            "--guard",
            "_bad_inputs.objectives:make_guard",
        )
    )


def trial_process_killed() -> None:
    """``omp.optimize`` whose trial process gets SIGKILL (as from the OOM killer): the trial ends FAIL."""
    import optuna

    import optuna_memprune as omp

    from . import objectives as o

    os.environ["PROBE_MARKER"] = str(Path("t.pid").resolve())

    def kill_when_started() -> None:
        for _ in range(600):
            if Path("t.pid").exists():
                os.kill(int(Path("t.pid").read_text()), signal.SIGKILL)
                return
            time.sleep(0.05)

    guard = omp.MemoryGuard(o.footprint, omp.Budget(ram="1GiB"), search_space=o.SPACE)
    study = optuna.create_study(
        storage="sqlite:///study.db", study_name="s", sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0))
    )
    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    omp.optimize(study, o.wait_to_be_killed, guard=guard, n_trials=1, show_progress_bar=False)


def _sigint_as_in_a_terminal() -> None:
    """SIGINT back to its default disposition, inherited by what this scenario starts: a probe run in the
    background of a non-interactive shell (``cmd &``) inherits SIGINT *ignored*, and so would the command it
    interrupts, which then never sees the Ctrl-C the scenario sends (as in no terminal's foreground job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_worker() -> None:
    """Ctrl-C in the terminal of ``memprune worker`` mid-trial: SIGINT to its whole process group."""
    _sigint_as_in_a_terminal()
    proc = _start(
        *WORKER,
        "_bad_inputs.objectives:wait_to_be_killed",
        "--storage",
        "sqlite:///study.db",
        "--study",
        "s",
        *GUARD,
        marker="t.pid",
        session=True,
    )
    _wait_for("t.pid", proc)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    rc = _finish(proc, timeout=30)
    _facts(sigint_to_exit_s=round(time.monotonic() - sent, 2))
    sys.exit(rc)


def interrupt_calibrate_parent() -> None:
    """SIGINT to the ``memprune calibrate --force`` process alone (not its probes), while a probe runs."""
    import psutil

    _sigint_as_in_a_terminal()
    proc = _start("calibrate", "--force")
    deadline = time.monotonic() + 30
    while not psutil.Process(proc.pid).children() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the probe is under way: the parent must not wait for it to finish
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = _finish(proc, timeout=40)
    _facts(sigint_to_exit_s=round(time.monotonic() - sent, 2))
    sys.exit(rc)


def terminate_worker() -> None:
    """``kill PID`` (SIGTERM) of ``memprune worker`` mid-trial, as a scheduler stops a job."""
    proc = _start(
        *WORKER,
        "_bad_inputs.objectives:wait_to_be_killed",
        "--storage",
        "sqlite:///study.db",
        "--study",
        "s",
        *GUARD,
        marker="t.pid",
    )
    _wait_for("t.pid", proc)
    proc.terminate()
    rc = _finish(proc, timeout=30)
    _facts(worker_status=rc)


def concurrent_calibrations() -> None:
    """Two ``memprune calibrate --env`` at once on one cache dir; then a third asks for both envs and must
    find both measured (a lost update would measure one again)."""
    first = _start("calibrate", "--env", "Acrobot-v1")
    second = _start("calibrate", "--env", "MountainCar-v0")
    rcs = [_finish(first, 90), _finish(second, 90)]
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "optuna_memprune.cli",
            "-v",
            "calibrate",
            "--env",
            "Acrobot-v1",
            "--env",
            "MountainCar-v0",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    remeasured = [env for env in ("Acrobot-v1", "MountainCar-v0") if f"Calibrating environment {env}" in check.stderr]
    sys.stdout.write(check.stdout)
    sys.stderr.write(check.stderr)
    _facts(statuses=rcs, remeasured=remeasured)
    sys.exit(max(rcs + [check.returncode]))


def leave_running_trial() -> None:
    """Setup: one guarded trial that ran, then a worker SIGKILLed mid-trial leaves its trial RUNNING (until a
    runner of this study reaps it)."""
    _run(*WORKER, "_bad_inputs.objectives:quick", "--storage", "sqlite:///study.db", "--study", "s", *GUARD)
    victim = _start(
        *WORKER,
        "_bad_inputs.objectives:wait_to_be_killed",
        "--storage",
        "sqlite:///study.db",
        "--study",
        "s",
        *GUARD,
        marker="t.pid",
    )
    _wait_for("t.pid", victim)
    victim.kill()
    _finish(victim)
