"""What a user without torch gets: the core install alone (``pip install optuna-memprune``, no extras) in a
fresh venv, used as a LightGBM or scikit-learn user would use it.

Checks, each against the real install (``scripts/core_check.sh`` makes the venv and runs this with its
Python):
- no torch, rich, matplotlib or nvidia-ml-py was installed, and the venv's size;
- a study guarded in process by a learned footprint (``scripts/core/learned_study.py``): 20 trials, each with
  a record, the first ones unchecked, later ones predicted;
- ``memprune run`` on an unchanged LightGBM search with no main guard and ``n_jobs=2``
  (``scripts/core/gbm_search.py``): exactly its 10 trials, all COMPLETE with a record, the program's exit 0,
  the records kept on ``--storage``;
- ``memprune report``: the terminal table in plain text, JSON, and for HTML one line naming the extra;
- ``estimate.torch_training`` without torch: one line naming the extra.

Prints one line per check and ``CORE checks=<n> passed=<p> core_venv_mib=<m>``; exits 1 if any failed.
Run: ``bash scripts/core_check.sh`` (CI runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "core"
BIN = Path(sys.executable).parent
results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    results.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def run(*cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line the command printed (stdout or stderr)."""
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return lines[-1] if lines else "(nothing printed)"


def trials(url: str) -> list:
    import optuna

    summaries = optuna.get_all_study_summaries(url)
    return [t for s in summaries for t in optuna.load_study(study_name=s.study_name, storage=url).trials]


def main() -> int:
    from importlib.util import find_spec

    import optuna

    import optuna_memprune as omp

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    venv = Path(sys.prefix)
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink()) // 2**20
    extras = [m for m in ("torch", "rich", "matplotlib", "pynvml") if find_spec(m) is not None]
    core = os.environ.get("CORE_VENV_MIB", "?")
    check(
        "core install",
        not extras,
        f"no torch, rich, matplotlib or nvidia-ml-py ({extras or 'none'} found); "
        f"venv {core} MiB with the core alone, {size} MiB with scikit-learn and LightGBM",
    )

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = f"sqlite:///{work / 'learned.db'}"
        proc = run(str(BIN / "python"), str(HERE / "learned_study.py"), url, cwd=work)
        got = trials(url) if proc.returncode == 0 else []
        records = [omp.read_record(t.user_attrs) for t in got]
        decisions = [r.decision.value for r in records if r is not None]
        predicted = sum(d in ("admitted", "clamped", "rejected") for d in decisions)
        check(
            "learned study in process",
            proc.returncode == 0
            and len(got) == 20
            and None not in records
            and decisions[0] == "unchecked"
            and predicted >= 10,
            f"exit {proc.returncode}, {len(got)} trials, {len(decisions)} records: {predicted} predicted, "
            f"{decisions.count('unchecked')} unchecked"
            if proc.returncode == 0
            else tail(proc),
        )

        gbm = f"sqlite:///{work / 'gbm.db'}"
        proc = run(
            str(BIN / "memprune"),
            "run",
            "--ram",
            "1GiB",
            "--storage",
            gbm,
            "--",
            str(BIN / "python"),
            str(HERE / "gbm_search.py"),
            cwd=work,
        )
        got = trials(gbm) if proc.returncode == 0 else []
        states = [t.state.name for t in got]
        records = [omp.read_record(t.user_attrs) for t in got]
        check(
            "memprune run on a LightGBM search (n_jobs=2, no main guard)",
            proc.returncode == 0
            and len(got) == 10
            and set(states) == {"COMPLETE"}
            and None not in records
            and "process per trial" in proc.stderr,
            f"exit {proc.returncode}, {len(got)} trials {sorted(set(states))}, "
            f"{sum(r is not None for r in records)} records; {tail(proc)}",
        )

        proc = run(str(BIN / "memprune"), "report", gbm, cwd=work)
        check(
            "memprune report (plain table)",
            proc.returncode == 0
            and "decisions" in proc.stdout
            and "prediction quality" in proc.stdout
            and "learned predictions" in proc.stdout,
            f"exit {proc.returncode}, {len(proc.stdout.splitlines())} lines" if proc.returncode == 0 else tail(proc),
        )
        proc = run(str(BIN / "memprune"), "report", gbm, "-f", "json", cwd=work)
        try:
            n = len(json.loads(proc.stdout)["trials"])
        except (ValueError, KeyError) as exc:
            n, why = -1, repr(exc)
        check(
            "memprune report -f json",
            proc.returncode == 0 and n == 10,
            f"exit {proc.returncode}, {n} trials" if n >= 0 else why,
        )
        proc = run(str(BIN / "memprune"), "report", gbm, "-f", "html", "-o", str(work / "r.html"), cwd=work)
        line = proc.stderr.strip()
        check(
            "memprune report -f html says which extra",
            proc.returncode == 1 and len(line.splitlines()) == 1 and 'pip install "optuna-memprune[report]"' in line,
            f"exit {proc.returncode}: {line}",
        )

    proc = run(str(BIN / "python"), "-c", "from optuna_memprune.estimate import torch_training", cwd=Path.cwd())
    last = tail(proc)
    check(
        "estimate.torch_training without torch",
        proc.returncode == 1 and "MissingExtra" in last and 'pip install "optuna-memprune[torch]"' in last,
        last,
    )

    passed = sum(ok for _, ok, _ in results)
    print(f"CORE checks={len(results)} passed={passed} core_venv_mib={core}")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
