"""Fixtures shared by the test directories: a real PostgreSQL server started for the session."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the programs the tests start whatever started the tests: a shell that runs a command
    in the background (``cmd &``) starts it with SIGINT ignored, every child inherits that, and the tests
    that send a child Ctrl-C then saw it ignored (they timed out)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: Per test, the seconds it took in a full run (setup + call + teardown), written by
#: ``python scripts/test_durations.py JUNIT_XML``; ``--quick`` leaves out those over ``QUICK_MAX_S``.
DURATIONS = Path(__file__).resolve().parent / "durations.json"
QUICK_MAX_S = 2.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help=f"the edit-test loop: leave out the tests that took over {QUICK_MAX_S:g} s in the full run "
                          "recorded in tests/durations.json (new tests run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    import json

    took = json.loads(DURATIONS.read_text())
    slow = [item for item in items if took.get(item.nodeid, 0.0) > QUICK_MAX_S]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if took.get(item.nodeid, 0.0) <= QUICK_MAX_S]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))  # Debian keeps them off PATH
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bins() -> tuple[str, str]:
    """PostgreSQL's ``initdb`` and ``pg_ctl`` with psycopg 3, or a skip saying which is missing (a failure in
    CI, whose ``.ci/run`` installs them)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are missing; .ci/run should install them")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install -e '.[test]')")
    return initdb, pg_ctl


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free local port; yields the server's base URL.

    Needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``; ``.ci/run`` installs them) and psycopg 3.
    The server refuses to run as root, so as root it runs as the ``postgres`` user. Skipped with the
    reason where the binaries are missing, except in CI (``CI`` set), where that is a failure.
    """
    initdb, pg_ctl = _pg_bins()
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="memprune-pg-"))
    data, port = root / "data", _free_port()
    if as_user:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
                    "start"], check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's PostgreSQL server (its SQLAlchemy URL)."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_server.replace("postgresql+psycopg", "postgresql") + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{postgres_server}/{name}"


class PostgresCluster:
    """A throwaway PostgreSQL cluster of one test that the test may stop and start again on the same port."""

    def __init__(self, root: Path, initdb: str, pg_ctl: str) -> None:
        self.root, self.data, self.port, self.pg_ctl = root, root / "data", _free_port(), pg_ctl
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run([*self.as_user, initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-w", "-l", str(self.root / "log"), "-o",
                        f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"


@pytest.fixture
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster of this test alone (``postgres_server``'s requirements and skips), to restart."""
    initdb, pg_ctl = _pg_bins()
    root = Path(tempfile.mkdtemp(prefix="memprune-pg-"))
    cluster = PostgresCluster(root, initdb, pg_ctl)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
