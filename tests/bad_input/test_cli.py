"""Bad input to ``memprune predict``, ``calibrate`` and ``report``, each through a real CLI process: one line
that names the value and what was expected (exit 2 for a command line that asks for the impossible, 1 for a
fault while running), never a traceback; and Ctrl-C exits 130 with no probe process left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from optuna_memprune import storages

from . import _unwritable

HERE = Path(__file__).resolve().parent
GUARD_TESTS = HERE.parent / "guard"  # _runner_objectives: the objectives the runner tests use
CLI = [sys.executable, "-m", "optuna_memprune.cli"]
PREDICT = ["predict", "sb3", "--algo", "dqn", "--env", "CartPole-v1"]
PROBE = "optuna_memprune.estimate.probes."


def memprune(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    # No calibration recheck (tests/estimate/test_recheck.py's subject): a command that reads the suite's cache
    # once it is 10 minutes old would add a probe, and, under the suite's load, maybe a warning line.
    base = {k: v for k, v in os.environ.items() if k != storages.ENV_VAR} | {"MEMPRUNE_RECHECK": "0"}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=600, **kwargs
    )


def error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The one line ``memprune: error: ...`` of a failed command, without its prefix (asserting it is one)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("memprune: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr[len("memprune: error: ") :].rstrip("\n")


@pytest.fixture(scope="module", autouse=True)
def _calibrated() -> None:
    """CartPole-v1 calibrated first: a first prediction in a fresh cache also prints the one-off calibration note."""
    proc = memprune("calibrate", "--env", "CartPole-v1", "-q")
    assert proc.returncode == 0, proc.stderr


# -- values beyond any real machine (issue 14, item 5) -------------------------------------------------------


@pytest.mark.parametrize(
    "param, message",
    [
        (
            "buffer_size=1e99",
            "param 'buffer_size' must be an int in [1, 2**50], but got 1e+99: more items of a byte or "
            "more would fill over 1 PiB, more memory than any real machine has.",
        ),
        (
            "batch_size=1e9",
            "param 'batch_size' must be an int in [1, 2**24], but got 1000000000: a tensor with two such "
            "dimensions would hold over 2**48 elements, over 1 PiB in float32.",
        ),
        (
            "net_arch=[64,99999999]",
            "param 'net_arch' layer width must be an int in [1, 2**24], but got 99999999: a "
            "tensor with two such dimensions would hold over 2**48 elements, over 1 PiB in float32.",
        ),
        (
            "torch_threads=10000000",
            "param 'torch_threads' must be an int in [1, 2**22], but got 10000000: Linux runs no "
            "more processes or threads than its PID_MAX_LIMIT.",
        ),
    ],
)
def test_a_value_beyond_any_real_machine_is_rejected_with_its_ceiling(param: str, message: str) -> None:
    assert error_line(memprune(*PREDICT, param), 2) == message


def test_a_total_beyond_any_real_machine_is_rejected_naming_what_to_check() -> None:
    line = error_line(memprune(*PREDICT, "buffer_size=1e15"), 2)
    assert re.fullmatch(
        r"the predicted RAM of dqn on CartPole-v1 is \d+\.\d\d TiB, over 1 PiB, more memory than "
        r"any real machine has: check buffer_size, n_steps, batch_size, n_envs, frame_stack and "
        r"net_arch\.",
        line,
    ), line
    ok = memprune(*PREDICT, "buffer_size=1e6", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ram"] > 100e6, ok.stderr


def test_n_envs_beyond_the_pid_limit_is_rejected() -> None:
    assert error_line(memprune(*PREDICT, "--n-envs", "5000000"), 2) == (
        "n_envs must be an int in [1, 2**22], but got 5000000: Linux runs no more processes or threads than its "
        "PID_MAX_LIMIT."
    )


# -- options checked before any probe runs (item 6) ----------------------------------------------------------


def test_a_negative_frame_stack_is_a_usage_error_before_probing(tmp_path: Path) -> None:
    """A fresh cache: a probe would be the first thing to run, and would fail with a flattened traceback."""
    proc = memprune(*PREDICT, "--frame-stack", "-2", env={"MEMPRUNE_CACHE_DIR": str(tmp_path)})
    assert error_line(proc, 2) == "frame_stack must be a positive int, but got -2."
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("NoSuchEnv-v0", "unknown env id 'NoSuchEnv-v0': not in Gymnasium's registry."),
        (
            "CartPole-v9",
            "unknown env id 'CartPole-v9': not in Gymnasium's registry (close matches: 'CartPole-v1', "
            "'CartPole-v0', 'phys2d/CartPole-v1').",
        ),
        (
            "ALE/Pongg-v5",
            "unknown env id 'ALE/Pongg-v5': not in Gymnasium's registry (close matches: 'ALE/Pong-v5', "
            "'ALE/Pooyan-v5', 'ALE/Boxing-v5').",
        ),
        (
            "no_such_module:Foo-v0",
            "unknown env id 'no_such_module:Foo-v0': its module 'no_such_module' cannot be "
            "imported (No module named 'no_such_module').",
        ),
    ],
)
def test_an_unknown_env_id_is_named_before_probing(env_id: str, message: str, tmp_path: Path) -> None:
    env = {"MEMPRUNE_CACHE_DIR": str(tmp_path)}
    assert error_line(memprune("predict", "sb3", "--algo", "dqn", "--env", env_id, env=env), 2) == message
    assert error_line(memprune("calibrate", "--env", env_id, env=env), 2) == message
    assert list(tmp_path.iterdir()) == []  # checked before the stacks were measured


def test_a_known_env_without_a_version_is_accepted() -> None:
    """``CartPole`` means its latest version, as ``gymnasium.make`` reads it."""
    proc = memprune("predict", "sb3", "--algo", "ppo", "--env", "CartPole", "--json")
    assert proc.returncode == 0, proc.stderr


# -- Ctrl-C while probes run (item 6) ------------------------------------------------------------------------


def _hanging_probes(tmp_path: Path) -> dict[str, str]:
    """An environment in which every calibration probe hangs at start-up (a ``sitecustomize`` that sleeps when
    the interpreter runs a probe module): the interrupt surely lands while probes run, and a probe left
    behind would still be there an hour later."""
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        "with open('/proc/self/cmdline', 'rb') as f:\n"
        f"    if b{PROBE!r} in f.read():\n"
        "        import time\n"
        "        time.sleep(3600)\n"
    )
    path = os.pathsep.join(p for p in (str(hang), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")}


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _is_probe(pid: int) -> bool:
    try:
        return PROBE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("command", [PREDICT, ["calibrate"]], ids=["predict", "calibrate"])
@pytest.mark.parametrize("whom", ["group", "parent"])
def test_ctrl_c_while_probing_exits_130_and_leaves_no_probe(command: list[str], whom: str, tmp_path: Path) -> None:
    """``group``: Ctrl-C in a terminal (SIGINT to the whole process group); ``parent``: SIGINT to the memprune
    process alone. Either way: exit 130, no traceback, and every probe it started is gone."""
    base = {k: v for k, v in os.environ.items() if k != storages.ENV_VAR}
    proc = subprocess.Popen(
        [*CLI, *command],
        env={**base, **_hanging_probes(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        probes: list[int] = []
        for _ in range(1200):  # hang guard: 60 s for the first probe to start
            probes = [p for p in _children(proc.pid) if _is_probe(p)]
            if probes or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert probes, f"no probe started: {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}"
        time.sleep(0.5)  # the probes are well into their (endless) start-up
        if whom == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # hang guard: without the fix it waits for the probes, forever
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not [p for p in probes if Path(f"/proc/{p}").exists()], "a probe outlived memprune"


# -- read-only storages (item 6) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file holding study 's' with two guarded trials, run by ``memprune worker``."""
    d = tmp_path_factory.mktemp("guarded")
    db = d / "study.db"
    proc = memprune(
        "worker",
        "_runner_objectives:hold",
        "--footprint",
        "_runner_objectives:footprint",
        "--ram",
        "1GiB",
        "--host-ram",
        "4GiB",
        "--no-progress",
        "--storage",
        f"sqlite:///{db}",
        "--study-name",
        "s",
        "--n-trials",
        "2",
        "--ledger",
        f"sqlite:///{d / 'ledger.sqlite'}",
        cwd=GUARD_TESTS,
    )
    assert proc.returncode == 0, proc.stderr
    return db


def _read_only_copy(db: Path, where: Path, *, file_mode: int, dir_mode: int) -> Path:
    """A copy of ``db`` in a new directory ``where``, with these modes (checked to bind the command's process)."""
    where.mkdir()
    copy = where / db.name
    copy.write_bytes(db.read_bytes())
    copy.chmod(file_mode)
    where.chmod(dir_mode)
    _unwritable.check_unwritable(copy if dir_mode & 0o200 else where)
    return copy


def test_a_read_only_sqlite_file_is_reported_as_read_only(guarded_db: Path, tmp_path: Path) -> None:
    db = _read_only_copy(guarded_db, tmp_path / "ro", file_mode=0o444, dir_mode=0o755)
    url = f"sqlite:///{db}"
    base = {k: v for k, v in os.environ.items() if k != storages.ENV_VAR}
    read = _unwritable.run([*CLI, "report", url, "-f", "json"], env=base)
    assert read.returncode == 0 and json.loads(read.stdout)["study"]["n_guarded"] == 2, read.stderr  # reading is fine
    notes = _unwritable.run([*CLI, "report", url, "--dashboard-notes"], env=base)
    assert error_line(notes, 1) == (
        f"the SQLite file {str(db)!r} is read-only (from {url}): make it writable, or "
        "copy it to a writable place and use the copy"
    )
    worker = _unwritable.run(
        [
            *CLI,
            "worker",
            "_runner_objectives:hold",
            "--footprint",
            "_runner_objectives:footprint",
            "--ram",
            "1GiB",
            "--host-ram",
            "4GiB",
            "--no-progress",
            "--storage",
            url,
            "--study-name",
            "s",
            "--n-trials",
            "1",
            "--ledger",
            f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        ],
        env=base,
        cwd=GUARD_TESTS,
    )
    line = error_line(worker, 1)
    assert (
        line.endswith(
            f"the SQLite file {str(db)!r} is read-only (from {url}): make it writable, or copy it to "
            "a writable place and use the copy"
        )
        and "exceeding max length" not in line
    ), line
    assert optuna.load_study(study_name="s", storage=url).trials[-1].number == 1  # nothing was added


def test_a_sqlite_file_in_a_read_only_directory_is_reported_so(guarded_db: Path, tmp_path: Path) -> None:
    db = _read_only_copy(guarded_db, tmp_path / "ro", file_mode=0o644, dir_mode=0o555)
    url = f"sqlite:///{db}"
    try:
        notes = _unwritable.run(
            [*CLI, "report", url, "--dashboard-notes"],
            env={k: v for k, v in os.environ.items() if k != storages.ENV_VAR},
        )
    finally:
        db.parent.chmod(0o755)
    assert error_line(notes, 1) == (
        f"the directory of the SQLite file {str(db)!r} is read-only (from {url}): the storage writes its journal "
        "beside the file; make the directory writable, or use a copy elsewhere"
    )
