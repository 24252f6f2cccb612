"""The calibration recheck at study start, with real probes and real study processes: a stale cached baseline
is recalibrated with one log line, one within tolerance is kept and its check noted, the recheck runs once
per process, not at all when switched off or when the entry is recent, a failing probe keeps the cache, and
``memprune calibrate`` keeps every stack when one read after others drifted."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from optuna_memprune.estimate import calibration, recheck

PROBE = "optuna_memprune.estimate.probes."
HOURS = 3600.0

# A real guarded study whose footprint reads the calibrated torch baseline (its first prediction is the
# study's start); it prints the baseline it predicted with. Logging as the CLI sets it up, with debug lines.
STUDY = """
    import json, logging, optuna
    import optuna_memprune as omp
    from optuna_memprune.estimate import process
    from optuna_memprune.guard import MemoryGuard
    logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen = []
    def footprint(params):
        fp = process("torch", torch_threads=1)
        seen.append(fp.ram)
        return fp
    guard = MemoryGuard(footprint, omp.Budget(ram="8GiB"))
    study = optuna.create_study(sampler=guard.wrap_sampler(optuna.samplers.RandomSampler(seed=0)))
    study.optimize(guard.wrap_objective(lambda t: t.suggest_float("x", 0, 1)), n_trials=3)
    print(json.dumps({"states": [t.state.name for t in study.trials], "seen": seen}))
"""


def _probe_counter(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose interpreters note each calibration probe's start in a file (a ``sitecustomize``
    reading its own command line): the count of real probes a process ran."""
    site = tmp_path / "site"
    site.mkdir()
    log = tmp_path / "probes.log"
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        with open('/proc/self/cmdline', 'rb') as f:
            cmd = f.read()
        if {PROBE.encode()!r} in cmd:
            with open({str(log)!r}, 'a') as out:
                out.write(cmd.split(b'\\0')[2].decode() + '\\n')
    """)
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")}, log


def _probes(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _lines(proc: subprocess.CompletedProcess, words: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if words in line]


# one test process for the module: split, each process measured the stacks of the fixture below anew
pytestmark = pytest.mark.xdist_group("recheck")


@pytest.fixture(scope="module")
def measured_stacks(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """The torch stack and the bare interpreter's, measured once for the module by real probes in a fresh
    cache: the cache file's name and content."""
    where = tmp_path_factory.mktemp("measured")
    env, log = _probe_counter(where)
    _run("from optuna_memprune.estimate import calibration as c; c.load().stack(('torch',)); c.load().stack(())", env)
    assert len(_probes(log)) == 3  # torch at 1 and 4 threads, the bare interpreter
    (path,) = (where / "cache").glob("calibration-*.json")
    return path.name, json.loads(path.read_text())


@pytest.fixture()
def cache(tmp_path: Path, measured_stacks: tuple[str, dict]) -> tuple[dict[str, str], Path, Path]:
    """A fresh cache holding the module's measured torch stack and bare interpreter's, stamped as measured
    now (as a cache just filled by real probes is); the environment that counts probes, the probe log (empty)
    and the cache file."""
    env, log = _probe_counter(tmp_path)
    name, data = measured_stacks
    data = json.loads(json.dumps(data))
    now = time.time()
    for entry in data["stacks"].values():
        entry["measured_at"] = now
    path = tmp_path / "cache" / name
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    return env, log, path


def _edit(path: Path, *, age: float, scale: float = 1.0) -> dict:
    """Make every stack entry ``age`` seconds old (measured and rechecked) and its figures ``scale`` times
    what was measured; the torch entry as it was before."""
    data = json.loads(path.read_text())
    before = json.loads(json.dumps(data["stacks"]["stack:torch:1"]))
    for entry in data["stacks"].values():
        entry["measured_at"] -= age
        if "checked" in entry:
            entry["checked"]["at"] -= age
        for _, point in entry["points"]:
            point["warm"]["VmHWM"] = int(point["warm"]["VmHWM"] * scale)
    path.write_text(json.dumps(data))
    return before


def _torch(path: Path) -> dict:
    return json.loads(path.read_text())["stacks"]["stack:torch:1"]


def _ram(entry: dict) -> int:
    return entry["points"][0][1]["warm"]["VmHWM"]


@pytest.mark.parametrize("scale", [1.3, 0.7], ids=["30pct-high", "30pct-low"])
def test_a_stale_entry_is_recalibrated_at_the_next_study_start_with_one_log_line(cache, scale):
    env, log, path = cache
    measured = _edit(path, age=3.5 * HOURS, scale=scale)
    start = time.time()
    proc = _run(STUDY, env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["states"] == ["COMPLETE"] * 3
    assert "took longer than" not in proc.stderr  # the probes' seconds do not count against footprint_timeout
    drifted = _lines(proc, "drifted")
    assert len(drifted) == 1 and drifted[0].startswith("WARNING "), proc.stderr
    assert "The calibrated baseline of torch drifted: " in drifted[0] and "measured 3.5 h ago" in drifted[0]
    assert "recalibrated; 1 other stacks and 0 envs measured before are measured again" in drifted[0]
    # The recheck's probe at one thread, then the rest of the entry: two probes in all, once.
    assert sorted(_probes(log)) == [f"{PROBE}stack"] * 2
    entry = _torch(path)
    tol = recheck.tolerance(_ram(measured))
    assert entry["measured_at"] >= start and abs(_ram(entry) - _ram(measured)) <= tol
    edited = int(_ram(measured) * scale)  # the recheck's probe is the new entry's point at one thread
    assert f"{(_ram(entry) - edited) / edited:+.0%}; tolerance" in drifted[0]
    assert (_ram(entry) - edited) / edited == pytest.approx(1 / scale - 1, abs=0.03)
    assert entry["checked"]["drifted_from"] == int(_ram(measured) * scale)
    assert entry["checked"]["tolerance"] == recheck.tolerance(int(_ram(measured) * scale))
    assert set(json.loads(path.read_text())["stacks"]) == {"stack:torch:1"}  # the stale python stack dropped
    # Every prediction of the study used the recalibrated baseline, none the edited one.
    assert all(abs(ram - _ram(entry)) < tol for ram in out["seen"]) and out["seen"], out


def test_an_entry_within_tolerance_is_kept_and_its_recheck_noted(cache):
    env, log, path = cache
    measured = _edit(path, age=3.5 * HOURS)
    start = time.time()
    proc = _run(STUDY, env)
    assert not _lines(proc, "WARNING"), proc.stderr
    holds = _lines(proc, "The calibrated baseline of torch holds: ")
    assert len(holds) == 1 and "measured 3.5 h ago" in holds[0], proc.stderr
    assert _probes(log) == [f"{PROBE}stack"]
    entry = _torch(path)
    assert entry["points"] == measured["points"] and entry["measured_at"] == measured["measured_at"] - 3.5 * HOURS
    assert entry["checked"]["at"] >= start and entry["checked"]["tolerance"] == recheck.tolerance(_ram(measured))
    assert abs(entry["checked"]["ram"] - _ram(measured)) <= entry["checked"]["tolerance"]
    assert set(entry["checked"]["host"]) == {"MemAvailable", "Cached"}
    assert "stack:" in "".join(json.loads(path.read_text())["stacks"])  # the python stack stays too
    assert len(json.loads(path.read_text())["stacks"]) == 2


def test_the_recheck_runs_once_per_process(cache):
    """Three reads of two stacks through two Calibration objects of the same file, the entries made old again
    after the first read: one recheck probe in the process; the next process rechecks again."""
    env, log, path = cache
    _edit(path, age=3.5 * HOURS)
    code = f"""
        import json, pathlib, time
        from optuna_memprune.estimate import calibration as c
        path = pathlib.Path({str(path)!r})
        c.load().stack(("torch",))
        data = json.loads(path.read_text())
        for entry in data["stacks"].values():
            entry["measured_at"] -= 4 * 3600
            entry.get("checked", {{}})["at"] = time.time() - 4 * 3600
        path.write_text(json.dumps(data))
        c.load(path).stack(("torch",))
        c.load(path).stack(())
        c.load().stack(())
    """
    _run(code, env)
    assert _probes(log) == [f"{PROBE}stack"]
    _run(code, env)
    assert _probes(log) == [f"{PROBE}stack"] * 2


def test_a_study_start_does_not_wait_for_another_process_rechecking_the_same_file(cache):
    """The recheck lock held here, as by another process's recheck: the study runs no probe of its own, waits
    for none, and predicts with the cached figure."""
    env, log, path = cache
    _edit(path, age=3.5 * HOURS)
    with open(path.with_name(path.name + ".recheck.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = _run(STUDY, env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["states"] == ["COMPLETE"] * 3 and set(out["seen"]) == {_ram(_torch(path))}
    assert _probes(log) == [] and "checked" not in _torch(path) and "took longer than" not in proc.stderr


def test_a_recent_entry_is_not_rechecked(cache):
    env, log, path = cache
    _edit(path, age=recheck.RECENT_S / 2)
    _run(STUDY, env)
    assert _probes(log) == [] and "checked" not in _torch(path)


@pytest.mark.parametrize("off", ["0", "off"])
def test_recheck_off_runs_no_probe(cache, off):
    env, log, path = cache
    _edit(path, age=3.5 * HOURS, scale=1.3)
    before = path.read_text()
    proc = _run(STUDY, {**env, recheck.ENV_VAR: off})
    assert _probes(log) == [] and path.read_text() == before and not _lines(proc, "WARNING"), proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["seen"] and set(out["seen"]) == {int(_ram(_torch(path)))}  # the cached (edited) figure


def test_a_failing_recheck_probe_keeps_the_cache_and_the_study_goes_on(cache):
    """Every probe of the study's process fails at start-up (its sitecustomize ends it with status 3): one warning,
    the cache untouched, every trial complete."""
    env, log, path = cache
    _edit(path, age=3.5 * HOURS, scale=1.3)
    before = path.read_text()
    site = Path(env["PYTHONPATH"].split(os.pathsep)[0]) / "sitecustomize.py"
    site.write_text(site.read_text() + "    import os; os._exit(3)\n")
    proc = _run(STUDY, env)
    failed = _lines(proc, "The recheck of the calibrated baseline of torch failed")
    assert len(failed) == 1 and failed[0].startswith("WARNING ") and "the cached figures are kept" in failed[0]
    assert "exit 3" in failed[0] and path.read_text() == before
    assert json.loads(proc.stdout.strip().splitlines()[-1])["states"] == ["COMPLETE"] * 3


def test_a_bad_switch_is_a_value_error_naming_it(monkeypatch):
    monkeypatch.setenv(recheck.ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match=r"MEMPRUNE_RECHECK must be 1 or 0 \(on or off\), but got 'sometimes'"):
        recheck.enabled()


def test_an_entry_from_before_the_recheck_is_rechecked_and_its_age_said(tmp_path, monkeypatch):
    """A cache written before entries recorded their time (no ``measured_at``) counts as old."""
    env, log = _probe_counter(tmp_path)
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", env["MEMPRUNE_CACHE_DIR"])
    _run("from optuna_memprune.estimate import calibration as c; c.load().stack(())", env)
    (path,) = (tmp_path / "cache").glob("calibration-*.json")
    data = json.loads(path.read_text())
    entry = data["stacks"]["stack::0"]
    del entry["measured_at"], entry["host"]
    entry["points"][0][1]["warm"]["VmHWM"] *= 2
    path.write_text(json.dumps(data))
    proc = _run(
        "import logging; logging.basicConfig(); "
        "from optuna_memprune.estimate import calibration as c; c.load().stack(())",
        env,
    )
    drifted = _lines(proc, "drifted")
    assert len(drifted) == 1 and "measured by an older version" in drifted[0], proc.stderr
    assert calibration.load(path).stacks()[0].measured_at is not None


def test_calibrate_keeps_every_stack_when_a_later_one_drifted(cache):
    """``memprune calibrate`` (``recipes.calibrate``) while another process rechecks the file: torch's stale
    baseline is read as cached (the recheck lock is held), the next stack's is rechecked, found drifted and
    recalibrated, which drops every entry measured before it, torch's too; torch's is then measured again,
    so the calibration returned (the command's listing) and the file hold every stack."""
    env, log, path = cache
    _edit(path, age=3.5 * HOURS)
    data = json.loads(path.read_text())
    (python_key,) = [key for key in data["stacks"] if key != "stack:torch:1"]
    for _, point in data["stacks"][python_key]["points"]:  # 3x: past the 8 MiB tolerance of a small stack
        point["warm"]["VmHWM"] = int(point["warm"]["VmHWM"] * 3)
    path.write_text(json.dumps(data))
    code = f"""
        import fcntl, json, logging, types
        from optuna_memprune.estimate import calibration, recipes
        from optuna_memprune.estimate.processes import STACKS
        logging.basicConfig(format="%(levelname)s %(name)s %(message)s")  # as the CLI's
        lock = open({str(path)!r} + ".recheck.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)  # as another process's recheck: the first read finds the lock held
        stack = calibration.Calibration.stack
        def stack_then_release(self, *args, **kwargs):
            try:
                return stack(self, *args, **kwargs)
            finally:
                lock.close()  # that recheck is over: the next read rechecks
        calibration.Calibration.stack = stack_then_release
        recipes.RECIPES.clear()  # torch's stack, then the bare interpreter's as a recipe's
        recipes.RECIPES["python"] = types.SimpleNamespace(STACKS={{"python": STACKS["python"]}})
        cal, _, _ = recipes.calibrate()
        print(json.dumps(sorted(base.imports for base in cal.stacks())))
    """
    proc = _run(code, env)
    drifted = _lines(proc, "drifted")
    assert len(drifted) == 1 and "The calibrated baseline of python drifted" in drifted[0], proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[], ["torch"]]
    assert set(json.loads(path.read_text())["stacks"]) == {"stack:torch:1", python_key}
