"""Faults of the calibration cache, each with real processes and real files: a cache directory that is a file,
under a file or not writable (one line before any probe runs), a cache file with entries of the wrong types
(measured again, with a warning), and concurrent writers (every entry survives)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from optuna_memprune.estimate import calibration, recipes

from . import _unwritable

CLI = [sys.executable, "-m", "optuna_memprune.cli"]
PREDICT = ["predict", "sb3", "--algo", "dqn", "--env", "CartPole-v1"]
ADVICE = "set MEMPRUNE_CACHE_DIR to a writable directory."


def memprune(*args: str, cache: Path, run=subprocess.run, **kwargs) -> subprocess.CompletedProcess:
    """``memprune ARGS`` with this cache directory, by ``run`` (``subprocess.run``, ``_unwritable.run``)."""
    kw = {"capture_output": True, "text": True, "timeout": 600}
    return run([*CLI, *args], env={**os.environ, "MEMPRUNE_CACHE_DIR": str(cache)}, **{**kw, **kwargs})


def error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr  # no "Calibrating ..." line: no probe
    assert proc.stderr.startswith("memprune: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr[len("memprune: error: ") :].rstrip("\n")


@pytest.fixture(scope="module")
def measured() -> calibration.Calibration:
    """This host's calibration with every stack, the kernels and CartPole's profile as ``PREDICT`` reads it
    measured (cached once per environment)."""
    cal, _, _ = recipes.calibrate()
    recipes.sb3_recipe.env_profile("CartPole-v1", None, cal)
    return cal


def _seed(cache: Path, measured: calibration.Calibration, **changes) -> Path:
    """A cache directory holding a copy of the measured calibration, its stacks stamped as measured now (as in a
    cache just filled: the commands below run no recheck probe, which these tests are not about), with
    ``changes`` to its sections."""
    data = json.loads(json.dumps(measured.data))
    now = time.time()
    for entry in data.get("stacks", {}).values():
        entry["measured_at"] = now
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / measured.path.name
    path.write_text(json.dumps({**data, **changes}))
    return path


# -- the cache directory (issue 14, item 6) ------------------------------------------------------------------


@pytest.mark.parametrize("command", [PREDICT, ["calibrate"]], ids=["predict", "calibrate"])
def test_a_cache_dir_that_is_a_file(command: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("")
    assert error_line(memprune(*command, cache=cache), 1) == (
        f"cannot use {str(cache)!r} as the cache directory: it is a file, not a directory; {ADVICE}"
    )


def test_a_cache_dir_under_a_file(tmp_path: Path) -> None:
    """The directory cannot be made at all: a part of its path is a regular file."""
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "cache"
    assert error_line(memprune(*PREDICT, cache=cache), 1) == (
        f"cannot use {str(cache)!r} as the cache directory: a part of its path is a file, not a directory; {ADVICE}"
    )


@pytest.mark.parametrize("exists", [True, False], ids=["existing", "to-create"])
def test_an_unwritable_cache_dir(exists: bool, tmp_path: Path) -> None:
    """An existing directory without write permission, or one to create inside such a directory; the command
    runs as a process the file modes bind (see ``_unwritable``)."""
    parent = tmp_path / "ro"
    parent.mkdir()
    cache = parent if exists else parent / "cache"
    parent.chmod(0o555)
    try:
        _unwritable.check_unwritable(parent)
        proc = memprune(*PREDICT, cache=cache, run=_unwritable.run)
    finally:
        parent.chmod(0o755)
    assert error_line(proc, 1) == (f"cannot use {str(cache)!r} as the cache directory: permission denied; {ADVICE}")


@pytest.fixture(scope="module")
def complete(measured: calibration.Calibration, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A cache file that holds every figure ``PREDICT`` reads, as a writable cache is left after ``PREDICT`` ran
    on it, and that run's JSON output."""
    cache = tmp_path_factory.mktemp("complete") / "cache"
    path = _seed(cache, measured)
    warm = memprune(*PREDICT, "--json", cache=cache)
    assert warm.returncode == 0, warm.stderr
    return path, warm.stdout


def _complete_copy(complete: tuple[Path, str], cache: Path) -> Path:
    """A copy of the ``complete`` cache file in the directory ``cache``."""
    cache.mkdir(parents=True)
    path = cache / complete[0].name
    path.write_text(complete[0].read_text())
    return path


def test_a_complete_cache_in_a_read_only_dir_is_still_read(complete: tuple[Path, str], tmp_path: Path) -> None:
    """Nothing to measure, nothing to write: a read-only cache that holds every figure serves predictions."""
    cache = tmp_path / "cache"
    _complete_copy(complete, cache)
    proc = _predict_read_only(cache)
    assert proc.returncode == 0 and json.loads(proc.stdout) == json.loads(complete[1]), proc.stderr


def _predict_read_only(cache: Path) -> subprocess.CompletedProcess:
    """``memprune predict`` (as ``PREDICT``, JSON) with ``cache`` read-only, as a process that cannot write it."""
    cache.chmod(0o555)
    try:
        _unwritable.check_unwritable(cache)
        return memprune(*PREDICT, "--json", cache=cache, run=_unwritable.run)
    finally:
        cache.chmod(0o755)


def test_an_old_entry_in_a_read_only_cache_is_read_without_a_recheck(
    complete: tuple[Path, str], tmp_path: Path
) -> None:
    """A recheck that could not note its result is not run (issue 13, item 4): no probe, no warning."""
    cache = tmp_path / "cache"
    path = _complete_copy(complete, cache)
    data = json.loads(path.read_text())
    for entry in data["stacks"].values():  # every stack measured and rechecked hours ago
        entry["measured_at"] = time.time() - 4 * 3600
        entry.pop("checked", None)
    path.write_text(json.dumps(data))
    before = path.read_text()
    proc = _predict_read_only(cache)
    assert proc.returncode == 0 and json.loads(proc.stdout) == json.loads(complete[1]), proc.stderr
    assert "recheck" not in proc.stderr and "drifted" not in proc.stderr and path.read_text() == before


# -- a cache file with the wrong types (item 6) ----------------------------------------------------------------


def test_entries_of_the_wrong_types_are_measured_again_with_a_warning(tmp_path: Path, caplog) -> None:
    """The issue's case (``points: []`` gave an IndexError) and its kin: each entry is measured again."""
    path = tmp_path / "calibration.json"
    key = calibration._stack_key((), False, ())
    path.write_text(
        json.dumps(
            {
                "schema": calibration.SCHEMA,
                "stacks": {key: {"points": []}},
                "envs": ["not", "a", "dict"],
                "cpu_kernels": {"rules": "x", "coef": 1},
            }
        )
    )
    with caplog.at_level(logging.WARNING, logger="optuna_memprune"):
        cal = calibration.load(path)
        base = cal.stack(())
    assert 1_000_000 < base.ram < 100_000_000
    assert [r.getMessage() for r in caplog.records] == [
        f"The calibration cache {path} has a malformed 'envs' section: measuring it again.",
        f"The calibration entry {key} in {path} is malformed (points is empty): measuring it again.",
    ]
    on_disk = json.loads(path.read_text())
    assert on_disk["stacks"][key]["points"] and on_disk["envs"] == {}
    assert calibration.load(path).stack(()) == base  # now read back, not measured


@pytest.mark.parametrize(
    "raw, why",
    [
        (
            {"points": [[1, {"warm": {"VmHWM": "big", "Threads": 1}}]]},
            "points/0/1/warm/VmHWM is 'big', not a non-negative int",
        ),
        ({"points": [[1, {"warm": {"VmHWM": 1}}]]}, "no points/0/1/warm/Threads"),
        ({"points": [[True, {"warm": {"VmHWM": 1, "Threads": 1}}]]}, "points/0/0 is True, not a non-negative int"),
        ([1, 2], "no points"),
    ],
)
def test_each_malformed_stack_entry_is_named(raw, why: str, tmp_path: Path, caplog) -> None:
    path = tmp_path / "calibration.json"
    key = calibration._stack_key((), False, ())
    path.write_text(json.dumps({"schema": calibration.SCHEMA, "stacks": {key: raw}}))
    with caplog.at_level(logging.WARNING, logger="optuna_memprune"):
        calibration.load(path).stack(())
    assert [r.getMessage() for r in caplog.records] == [
        f"The calibration entry {key} in {path} is malformed ({why}): measuring it again."
    ]


def test_memprune_calibrate_measures_a_malformed_entry_again(measured: calibration.Calibration, tmp_path: Path) -> None:
    """Through the CLI: the warning is on stderr, the entry measured anew, the command succeeds."""
    cache = tmp_path / "cache"
    key = next(k for k in measured.data["stacks"] if k.startswith("stack:torch:1"))  # torch's own
    stacks = {**measured.data["stacks"], key: {"points": []}}
    path = _seed(cache, measured, stacks=stacks, cpu_kernels={"rules": ["a"], "coef": [], "block": 1})
    proc = memprune("calibrate", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"The calibration entry {key} in {path} is malformed (points is empty): measuring it again."
        in proc.stderr.splitlines()
    )
    assert (
        f"The calibration entry cpu_kernels in {path} is malformed (coef has 0 values for 1 rules): measuring "
        "it again." in proc.stderr.splitlines()
    )
    assert "Traceback" not in proc.stderr
    again = calibration.load(path)
    assert again.data["stacks"][key]["points"] and again.cpu_kernels().rules != ("a",)


def test_a_truncated_cache_file_is_measured_again_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "calibration.json"
    path.write_text('{"schema": 1, "stacks": {')
    with caplog.at_level(logging.WARNING, logger="optuna_memprune"):
        calibration.load(path).stack(())
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith(
        f"The calibration cache {path} is unreadable (Expecting property name"
    )
    assert json.loads(path.read_text())["stacks"]


# -- concurrent writers (item 7) -------------------------------------------------------------------------------

SAVER = textwrap.dedent("""
    import json, os, sys, time
    from optuna_memprune.estimate import calibration

    path, name, go = sys.argv[1], sys.argv[2], sys.argv[3]
    cal = calibration.load(path)          # every writer reads the file before any of them writes
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(15):
        cal.data.setdefault("envs", {})[f"env:{name}:{i}"] = {"from": name, "i": i}
        cal.save()
""")


def test_concurrent_saves_lose_no_entry(tmp_path: Path) -> None:
    """Six processes that all read the file first, then save 15 entries each as fast as they can: all 90
    entries, and the one that was there before, are in the file (and it is valid JSON throughout)."""
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"schema": calibration.SCHEMA, "envs": {"env:old": {"from": "before"}}}))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(path), f"w{n}", str(go)]) for n in range(6)]
    go.write_text("")
    assert all(p.wait(timeout=300) == 0 for p in procs)
    envs = json.loads(path.read_text())["envs"]
    assert set(envs) == {"env:old"} | {f"env:w{n}:{i}" for n in range(6) for i in range(15)}
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]  # no temporary file left behind


def test_two_memprune_calibrate_runs_keep_both_profiles(measured: calibration.Calibration, tmp_path: Path) -> None:
    """The issue's case: two ``memprune calibrate --env`` runs on one cache directory at the same time both
    succeed, and both envs' profiles are in the file afterwards."""
    cache = tmp_path / "cache"
    path = _seed(cache, measured, envs={})
    env = {**os.environ, "MEMPRUNE_CACHE_DIR": str(cache)}
    procs = [
        subprocess.Popen(
            [*CLI, "calibrate", "--env", env_id, "-f", "json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env_id in ("CartPole-v1", "Acrobot-v1")
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    reported = {json.loads(out)["envs"][0]["env_id"] for out, _ in outs}
    assert reported == {"CartPole-v1", "Acrobot-v1"}
    kept, before = calibration.load(path), path.read_text()
    assert len(kept.data["envs"]) == 2
    profiles = [recipes.sb3_recipe.calibrate_env(env_id, kept) for env_id in ("CartPole-v1", "Acrobot-v1")]
    assert [p.env_id for p in profiles] == ["CartPole-v1", "Acrobot-v1"] and path.read_text() == before  # read


# -- Ctrl-C of ``memprune calibrate`` (issue 14, item 6) ------------------------------------------------------

PROBES = "optuna_memprune.estimate.probes."


def _procs_under(pid: int) -> dict[int, bytes]:
    """Every live descendant of ``pid``: its cmdline."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child in [c for c, p in parents.items() if p == parent]:
            try:
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            todo.append(child)
    return found


@pytest.mark.parametrize("kind", ["stack", "kernels", "env"])
def test_ctrl_c_of_calibrate_alone_while_each_probe_runs(
    kind: str, measured: calibration.Calibration, tmp_path: Path
) -> None:
    """SIGINT to the ``memprune calibrate`` process alone (not its probes, which run in sessions of their own)
    while a real probe of each kind runs: exit 130 without a traceback, and neither the probe nor anything it
    started is left running. The command starts with SIGINT at its default, as a terminal's foreground job
    (a test run in the background of a shell would otherwise hand it SIGINT ignored)."""
    missing = {"stack": {"stacks": {}}, "kernels": {"cpu_kernels": None}, "env": {"envs": {}}}[kind]
    cache = tmp_path / "cache"
    _seed(cache, measured, **missing)
    proc = subprocess.Popen(
        [*CLI, "calibrate", "--env", "CartPole-v1"],
        env={**os.environ, "MEMPRUNE_CACHE_DIR": str(cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        started: dict[int, bytes] = {}
        for _ in range(1200):  # hang guard: 120 s for the probe to start
            started = _procs_under(proc.pid)
            if any((PROBES + kind).encode() in cmd for cmd in started.values()) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert any((PROBES + kind).encode() in cmd for cmd in started.values()), proc.poll()
        time.sleep(0.2)  # the probe is under way
        started = _procs_under(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()], f"left running: {started}"
