"""scripts/gpu_wheels.sh: its pins, and the download it makes installed as far as this Python allows (the
pure-Python wheels with --no-index in a fresh venv; the one compiled wheel is for CPython 3.12)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "scripts" / "_gpu" / "wheels.txt"
LIMIT = 64 * 1024 * 1024


def pins() -> dict[str, str]:
    out = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[name.lower()] = version
    return out


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


def test_every_pin_is_one_exact_version_and_optuna_is_the_supported_major():
    text = [ln.split("#")[0].strip() for ln in PINS.read_text().splitlines()]
    lines = [ln for ln in text if ln]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", ln) for ln in lines), lines
    found = pins()
    assert len(found) == len(lines)  # one version of each
    assert found["optuna"].split(".")[0] == "5"  # pyproject: optuna>=5,<6
    # optuna's and alembic's own requirements the GPU image lacks are named (the rest it has)
    assert {"alembic", "colorlog", "sqlalchemy", "mako"} <= set(found)


def test_download_stays_under_the_carry_limit_and_installs_with_no_index(tmp_path):
    if not _pypi_reachable():
        if os.environ.get("CI"):
            pytest.fail("PyPI is not reachable from CI; the wheel download cannot be tested")
        pytest.skip("PyPI is not reachable from here")
    dest = tmp_path / "wheels"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_wheels.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GPU_WHEELS_DIR": str(dest), "PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    wheels = sorted(dest.glob("*.whl"))
    names = [re.split(r"-\d", w.name, maxsplit=1)[0].lower().replace("_", "-") for w in wheels]
    assert sorted(names) == sorted(pins()), names  # one wheel per pin, nothing else
    size = sum(w.stat().st_size for w in wheels)
    assert 0 < size < LIMIT and f"{size} bytes" in run.stdout
    command = next(ln for ln in run.stdout.splitlines() if ln.startswith("command: "))
    assert "--no-index" in command and "--target /tmp/site" in command and "gpu_check.py" in command
    assert len(command) < 2000  # what one device call takes
    assert all("cp312" in w.name or "py3-none-any" in w.name for w in wheels)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pure = [str(w) for w in wheels if w.name.endswith("-py3-none-any.whl")]
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            *pure,
        ],
        check=True,
        timeout=300,
    )
    check = (
        "import importlib.metadata as m, colorlog, mako; "
        "print(' '.join(f'{d}=={m.version(d)}' for d in ('optuna', 'alembic', 'colorlog', 'mako')))"
    )
    got = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert got == [f"{d}=={pins()[d]}" for d in ("optuna", "alembic", "colorlog", "mako")]
