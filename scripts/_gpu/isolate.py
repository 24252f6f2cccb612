"""One check in its own process under a time limit: a failure or a hang is a row, never the whole run's end.

Owns starting ``python -m _gpu.worker``, its time limit, its process group's end, and reading back the rows
it appended (one JSON object a line) so that what finished before a timeout is kept; knows nothing of
what a check measures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .results import failed_row
from .rows import ROOT, SCRIPTS

LOCK_ENV = "GPU_CHECK_LOCK"  # a file the children lock while they use the GPU (measurements one at a time)


def child_env(lock: str | None = None) -> dict[str, str]:
    """The environment of a check's process: this checkout's code and the kit importable, unbuffered."""
    env = dict(os.environ)
    paths = [str(ROOT), str(SCRIPTS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    if lock:
        env[LOCK_ENV] = lock
    return env


def run_check(
    check: str, args: dict[str, Any], *, timeout: float, lock: str | None = None, label: str | None = None
) -> list[dict[str, Any]]:
    """Run ``check`` of ``_gpu.worker`` with ``args`` in a new process group, killed after ``timeout`` s.

    Returns the rows the check wrote, plus a failed row (named ``label`` or ``check``) when it ran out of
    time, or exited non-zero without writing one (a crash); the exit is noted on a failure row it wrote.
    """
    label = label or check
    if timeout <= 0:
        return [failed_row(label, "not run: the check's time was used up by the ones before it")]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        log = Path(tmp) / "log"
        cmd = [sys.executable, "-m", "_gpu.worker", check, json.dumps({**args, "label": label}), str(out)]
        t0 = time.monotonic()
        with open(log, "wb") as logf:
            proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env(lock), cwd=str(ROOT), start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                _kill_group(proc)
        rows = _read_rows(out)
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        if rc is None:
            rows.append(failed_row(label, f"timed out after {timeout:.0f} s; last output: {tail}"))
        elif rc != 0:
            why = f"exit {rc} after {time.monotonic() - t0:.0f} s: {tail}"
            if any(r.get("ok") is False for r in rows):  # the check's own failure row says it already
                rows[-1]["exit"] = why
            else:
                rows.append(failed_row(label, why))
        return rows


def run_many(
    jobs: list[tuple[str, dict[str, Any], float, str]], *, parallel: int, lock: str | None, deadline: float
) -> list[list[dict]]:
    """Run ``(check, args, time limit, label)`` jobs, ``parallel`` at a time, none past ``deadline``
    (``time.monotonic()``); each job's limit is cut to the time left when it starts. Results in order."""

    def one(check: str, args: dict[str, Any], limit: float, label: str) -> list[dict]:
        return run_check(check, args, timeout=min(limit, deadline - time.monotonic()), lock=lock, label=label)

    with ThreadPoolExecutor(max(1, parallel)) as pool:
        return list(pool.map(lambda job: one(*job), jobs))


def _kill_group(proc: subprocess.Popen) -> None:
    """End the check's process group (its own children too, such as a trial's process), SIGKILL at once."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by the kill
            continue
    return rows
