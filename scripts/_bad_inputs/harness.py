"""The machinery of ``scripts/probe_bad_input.py``: what a case is, its post-conditions, running it in a fresh
process and session, counting what it left behind, and classifying its outcome (see the script's docstring).

Stdlib only: the probe's own process imports neither Optuna nor the package; it reads the cases' SQLite
files with sqlite3 and their processes from /proc.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
MARKER = "BAD_INPUT_PROBE_CASE"
FRAME = re.compile(r'File "[^"]+", line \d+')  # a stack frame, also in a traceback flattened into one line

# Which part of the package should fix a case that is not clear (the report groups by it).
RUNNER, GUARD, CALIB = "runner/ledger/report", "budget/guard/monitor", "calibration/predict/CLI"
ERROR, ACCEPT, EITHER = "error", "accept", "error or accept"


class Trial(NamedTuple):
    number: int
    state: str
    attrs: dict


@dataclass
class Result:
    rc: int | None
    out: str
    err: str
    elapsed: float
    timed_out: bool
    dir: Path

    def trials(self, db: str = "study.db") -> list[Trial]:
        return read_trials(self.dir / db)

    def facts(self) -> dict:
        path = self.dir / "facts.json"
        return json.loads(path.read_text()) if path.exists() else {}


Post = Callable[[Result], "str | None"]  # None when the post-condition holds, else what is wrong


@dataclass
class Case:
    name: str
    area: str
    expect: str  # ERROR, ACCEPT or EITHER
    run: str | list[str]  # Python lines (run by _bad_inputs.child) or `memprune` arguments
    names: tuple[str, ...] = ()  # what the error's last line must name ({dir}, {cache}: the case's paths)
    post: Post | None = None  # ERROR: checked on the error; ACCEPT, EITHER: on exit 0
    setup: str | None = None  # Python lines run first, in a process of their own
    env: dict = field(default_factory=dict)
    rc: int | None = None  # the exit status an error must have (e.g. 130 for Ctrl-C)
    readonly: bool = False  # run without the power to write read-only files (when run as root)
    running_ok: bool = False  # the setup leaves a RUNNING trial on purpose
    timeout: float = 60

    def expected(self) -> str:
        what = getattr(self.post, "__doc__", None) or "exit 0"
        if self.expect == ERROR:
            return (
                f"error naming {' and '.join(self.names) or '-'}"
                + (f" (exit {self.rc})" if self.rc else "")
                + (f"; {what}" if self.post else "")
            )
        return f"error naming {' and '.join(self.names)}, or {what}" if self.expect == EITHER else what


def E(name: str, area: str, run: str | list[str], *names: str, **kw) -> Case:
    """An input that must be refused with one line naming ``names``."""
    return Case(name, area, ERROR, run, names, **kw)


def A(name: str, area: str, run: str | list[str], post: Post | None = None, **kw) -> Case:
    """An input or fault that is right to accept, with ``post`` holding afterwards."""
    return Case(name, area, ACCEPT, run, (), post, **kw)


def EA(name: str, area: str, run: str | list[str], names: str, post: Post, **kw) -> Case:
    """Either refused with one line naming ``names``, or accepted with ``post`` holding (e.g. a warning)."""
    return Case(name, area, EITHER, run, (names,), post, **kw)


# -- post-conditions ---------------------------------------------------------------------------------


def read_trials(path: Path) -> list[Trial]:
    """The trials of an Optuna SQLite file (every study), read with sqlite3; [] when it is none."""
    if not path.is_file():
        return []
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT trial_id, number, state FROM trials ORDER BY trial_id").fetchall()
            attrs: dict[int, dict] = {}
            for tid, key, value in con.execute("SELECT trial_id, key, value_json FROM trial_user_attributes"):
                attrs.setdefault(tid, {})[key] = json.loads(value)
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return [Trial(number, state, attrs.get(tid, {})) for tid, number, state in rows]


def _post(doc: str):
    def wrap(check: Post) -> Post:
        check.__doc__ = doc
        return check

    return wrap


def trial(
    n: int, state: str | None = None, *, decision: str | None = None, reason: str | None = None, db: str = "study.db"
) -> Post:
    """Trial ``n`` of ``db`` ended in ``state`` (regex), with the record's decision and a reason matching."""

    @_post(f"trial #{n} {state or ''} {decision or ''} {'reason ~ ' + repr(reason) if reason else ''}".strip())
    def check(r: Result) -> str | None:
        t = next((t for t in r.trials(db) if t.number == n), None)
        if t is None:
            return f"no trial #{n} in {db}"
        got_decision, got_reason = t.attrs.get("memprune:decision"), t.attrs.get("memprune:reason", "")
        if state and not re.fullmatch(state, t.state):
            return f"trial #{n} is {t.state} ({got_decision}: {got_reason}), expected {state}"
        if decision and not re.fullmatch(decision, str(got_decision)):
            return f"trial #{n} decision {got_decision} ({got_reason}), expected {decision}"
        if reason and not re.search(reason, str(got_reason), re.I):
            return f"trial #{n} reason {str(got_reason)[:150]!r} does not say {reason!r}"
        return None

    return check


def every_trial(state: str, db: str = "study.db") -> Post:
    @_post(f"every trial {state}")
    def check(r: Result) -> str | None:
        trials = r.trials(db)
        bad = [f"#{t.number} {t.state}" for t in trials if not re.fullmatch(state, t.state)]
        return f"expected every trial {state}, got {bad}" if bad or not trials else None

    return check


def warns(pattern: str) -> Post:
    """stderr says something matching ``pattern`` (a warning the user sees, not only a log record)."""

    @_post(f"exit 0 with a warning ~ {pattern!r}")
    def check(r: Result) -> str | None:
        return None if re.search(pattern, r.err, re.I) else f"accepted without a warning matching {pattern!r}"

    return check


def prints(pattern: str) -> Post:
    @_post(f"exit 0, output ~ {pattern!r}")
    def check(r: Result) -> str | None:
        return None if re.search(pattern, r.out, re.I) else f"output does not show {pattern!r}"

    return check


def reasons(*, absent: str, present: str) -> Post:
    @_post(f"no reason ~ {absent!r}, some reason ~ {present!r}")
    def check(r: Result) -> str | None:
        said = [str(t.attrs.get("memprune:reason", "")) for t in r.trials()]
        if any(re.search(absent, s) for s in said):
            return f"a reason says {absent!r}: " + next(s for s in said if re.search(absent, s))[:150]
        return None if any(re.search(present, s, re.I) for s in said) else f"no reason says {present!r}"

    return check


def fact(key: str, test: Callable, text: str) -> Post:
    @_post(f"{key} {text}")
    def check(r: Result) -> str | None:
        value = r.facts().get(key)
        return None if value is not None and test(value) else f"{key}={value}, expected {text}"

    return check


def no_study(db: str = "study.db") -> Post:
    """nothing created: no study in ``db``"""

    @_post(f"no study created in {db}")
    def check(r: Result) -> str | None:
        path = r.dir / db
        if not path.is_file():
            return None
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                n = con.execute("SELECT count(*) FROM studies").fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            return None
        return f"the study was created in {db} before the input was refused" if n else None

    return check


def short_line(limit: int = 200) -> Post:
    @_post(f"one line of at most {limit} characters")
    def check(r: Result) -> str | None:
        line = last_line(r)
        return f"the error line is {len(line)} characters long" if len(line) > limit else None

    return check


def checked_or_documented(r: Result) -> str | None:
    """trial #0 checked before launch, or the docs' guard example (Getting started) passes search_space="""
    t = next((t for t in r.trials() if t.number == 0), None)
    if t is not None and t.attrs.get("memprune:decision") not in (None, "unchecked"):
        return None
    page = (ROOT / "docs" / "getting-started.md").read_text()
    example = page.split("## In your study", 1)[-1].split("```", 2)[1] if "## In your study" in page else ""
    return None if "search_space=" in example else "trial #0 ran unchecked and the docs' example omits search_space="


def no_running(db: str = "study.db") -> Post:
    return every_trial("COMPLETE|PRUNED|FAIL", db)


# -- running a case -------------------------------------------------------------------------------


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def _drop_write_override() -> None:
    """Run as root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so that a read-only file is read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # from the bounding set: exec recomputes root's capabilities from it
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "cannot drop CAP_DAC_OVERRIDE for a read-only case: run as a user")


def _case_pids(sid: int, token: str) -> list[int]:
    """Processes of the case: in its session, or with its marker in their environment (they left the session)."""
    needle = f"{MARKER}={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":
                continue
            if int(fields[3]) == sid or needle in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _reap(sid: int, token: str, grace: float = 5.0) -> int:
    """Wait ``grace`` s for the case's processes to end, then kill and count the ones left."""
    deadline = time.monotonic() + grace
    while (pids := _case_pids(sid, token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def _running(case_dir: Path) -> int:
    return sum(t.state == "RUNNING" for db in case_dir.rglob("*.db") for t in read_trials(db))


def last_line(r: Result) -> str:
    for text in (r.err, r.out):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def classify(case: Case, r: Result, subst: Callable[[str], str]) -> tuple[str, str]:
    """The outcome's class and the line that shows it."""
    line = last_line(r)
    if r.timed_out:
        return "hang", f"no exit within {case.timeout:.0f} s; last: {line}"
    if "Traceback" in r.out + r.err or FRAME.search(r.out + r.err):
        return "traceback", line
    if r.rc != 0:
        if case.expect == ACCEPT:
            return "silent", f"refused (exit {r.rc}) what is right to accept: {line}"
        if case.rc is not None and r.rc != case.rc:
            return "silent", f"exit {r.rc}, expected {case.rc}: {line}"
        missing = [n for n in map(subst, case.names) if not any(a.lower() in line.lower() for a in n.split("|"))]
        if missing:
            return "silent", f"the error does not name {' and '.join(missing)}: {line}"
        problem = case.post(r) if case.post and case.expect == ERROR else None
        return ("silent", f"{problem}: {line}") if problem else ("clear", line)
    if case.expect == ERROR:
        return "silent", f"accepted (exit 0), expected an error naming {' and '.join(case.names) or '-'}; last: {line}"
    problem = case.post(r) if case.post else None
    return ("silent", f"{problem}; last: {line}") if problem else ("clear", line)


class Outcome(NamedTuple):
    case: Case
    cls: str
    line: str
    running: int
    strays: int
    elapsed: float


def run_case(case: Case, base_cache: Path, work: Path, keep: bool) -> Outcome:
    case_dir = work / case.name
    case_dir.mkdir(parents=True)
    cache = case_dir / "cache"
    cache.mkdir()
    for f in base_cache.glob("calibration-*.json"):
        shutil.copy(f, cache)

    def subst(text: str) -> str:
        return text.replace("{dir}", str(case_dir)).replace("{cache}", str(cache))

    token = f"{os.getpid()}-{case.name}"
    env = {
        **os.environ,
        "MEMPRUNE_CACHE_DIR": str(cache),
        MARKER: token,
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("OPTUNA_STORAGE", None)
    env.update({k: subst(v) for k, v in case.env.items()})
    child = [sys.executable, "-m", "_bad_inputs.child"]
    if case.setup:
        setup = subprocess.run(
            [*child, case.setup],
            cwd=case_dir,
            env={**env, "MEMPRUNE_CACHE_DIR": str(cache)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        if setup.returncode != 0:
            print(f"[probe] setup of {case.name} failed: {setup.stderr.strip()[-300:]}", file=sys.stderr)
    cmd = (
        [*child, case.run]
        if isinstance(case.run, str)
        else [sys.executable, "-m", "optuna_memprune.cli", *map(subst, case.run)]
    )
    preexec = _drop_write_override if case.readonly and os.geteuid() == 0 else None
    start = time.monotonic()
    with open(case_dir / "stdout", "w") as out, open(case_dir / "stderr", "w") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=case_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=preexec,
        )
        try:
            rc, timed_out = proc.wait(timeout=case.timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, timed_out = proc.wait(), True
    elapsed = time.monotonic() - start
    strays = _reap(proc.pid, token)
    running = 0 if case.running_ok else _running(case_dir)
    result = Result(
        rc,
        (case_dir / "stdout").read_text(errors="replace"),
        (case_dir / "stderr").read_text(errors="replace"),
        elapsed,
        timed_out,
        case_dir,
    )
    cls, line = classify(case, result, subst)
    if not keep and cls == "clear" and not running and not strays:
        shutil.rmtree(case_dir, ignore_errors=True)
    return Outcome(case, cls, line.replace(str(case_dir), "{dir}"), running, strays, elapsed)


def prepare_cache(base: Path) -> None:
    """Calibrate once (torch, SB3 and CartPole-v1: about a minute), reused by every case and later runs."""
    base.mkdir(parents=True, exist_ok=True)
    print(f"[probe] calibration cache {base} (calibrating where it is missing)", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "-q", "calibrate", "--env", "CartPole-v1"],
        env={
            **os.environ,
            "MEMPRUNE_CACHE_DIR": str(base),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        check=True,
        stdout=subprocess.DEVNULL,
    )
