"""The documentation site builds with warnings as errors (mkdocs.yml: strict) and its API reference holds
the public names with their docstrings; every page README.md links to exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strict_with_the_api_reference(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is missing on CI: scripts/setup.sh installs the docs extra")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    guard = (tmp_path / "site" / "api" / "guard" / "index.html").read_text()
    for name in ("MemoryGuard", "wrap_objective", "optimize", "n_jobs", "show_progress_bar", "TrialRecord"):
        assert name in guard, name
    assert "Keeps Optuna trials inside a per-process memory and thread budget." in guard  # the docstring itself
    api = "".join(p.read_text() for p in (tmp_path / "site" / "api").rglob("*.html"))
    import optuna_memprune as omp

    # each documented object's heading carries its full path as its id; omp.read_record is records.read, and
    # omp.estimate is the Estimators page
    ids = set(re.findall(r'id="optuna_memprune\.[\w.]*?\.?(\w+)"', api))
    alias = {"read_record": "read"}
    missing = [n for n in omp.__all__ if n != "estimate" and alias.get(n, n) not in ids]
    assert missing == [], f"names of optuna_memprune.__all__ without an API page: {missing}"
    assert (tmp_path / "site" / "api" / "estimate" / "index.html").exists()
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Headline figures" in home and "API reference" in home


def test_readme_is_short_and_its_links_point_at_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert links and all((ROOT / link).exists() for link in links), [l for l in links if not (ROOT / l).exists()]
    first = readme.splitlines().index("```bash")  # the first block: the two set-up commands
    assert readme.splitlines()[first + 1 : first + 3] == [
        "bash scripts/main.sh    # sets up .venv, then runs the guarded demo study (SQLite file, no server)",
        "bash scripts/test.sh    # sets up .venv, then runs the test suite",
    ]


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """README's example, copied out as a user would, runs in a fresh directory: 30 trials, each with a
    record, in processes of their own, and none that ran to the end above the 1 GiB budget."""
    import optuna

    import optuna_memprune as omp

    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\n") + len("```python\n")
    (tmp_path / "example.py").write_text(readme[start : readme.index("```", start)])
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    trials = optuna.load_study(study_name="rows", storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    records = [omp.read_record(t.user_attrs) for t in trials]
    assert len(trials) == 30 and None not in records
    assert {r.host for r in records} != {None}  # run by omp.optimize's runner, one process per trial
    assert all(r.peak_ram <= 2**30 for t, r in zip(trials, records, strict=True) if t.state.name == "COMPLETE")
