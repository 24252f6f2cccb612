"""Fixtures shared by the test directories: a real PostgreSQL server started for the session."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from _pg import PostgresCluster, pg_bin  # noqa: E402 - scripts/_pg.py, shared with the fault drill
from test_durations import OUT as DURATIONS, QUICK_MAX_S, plain_nodeid  # noqa: E402 - scripts/test_durations.py writes what --quick reads


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the programs the tests start whatever started the tests: a shell that runs a command
    in the background (``cmd &``) starts it with SIGINT ignored, every child inherits that, and the tests
    that send a child Ctrl-C then saw it ignored (they timed out)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """SB3 makes a folder ``SB3-<date>`` in the system's temporary directory at every ``learn()`` without a
    log folder (``$SB3_LOGDIR`` else that): the tests' agents and the trial processes they start make
    theirs in one folder of this session's instead (a run of the suite left 12 in /tmp)."""
    before = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3-logs"))
    yield
    if before is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = before


# DURATIONS (tests/durations.json): per test, the seconds it took in a full run (setup + call + teardown),
# written by ``python scripts/test_durations.py JUNIT_XML``; ``--quick`` leaves out those over QUICK_MAX_S.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help=f"the edit-test loop: leave out the tests marked slow and those that took over {QUICK_MAX_S:g} s "
        "in the full run recorded in tests/durations.json (new tests run)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    import json

    took = json.loads(DURATIONS.read_text())

    def left_out(item: pytest.Item) -> bool:
        # A test marked slow goes too, whatever it took: a module's shared fixture is timed on its first
        # test, so a fast sibling (test_torchnet_cpu_rss's) still ran the 19 training processes, 156 s.
        return took.get(plain_nodeid(item.nodeid), 0.0) > QUICK_MAX_S or item.get_closest_marker("slow") is not None

    kept: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        (slow if left_out(item) else kept).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = kept


def _need_postgres() -> None:
    """PostgreSQL's ``initdb`` and ``pg_ctl`` with psycopg 3, or a skip saying which is missing (a failure in
    CI, whose ``.ci/run`` installs them)."""
    if pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are missing; .ci/run should install them")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster on a free local port (``scripts/_pg.py``), for the whole session.

    Needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``; ``.ci/run`` installs them) and psycopg 3.
    Skipped with the reason where the binaries are missing, except in CI (``CI`` set), where that is a failure.
    """
    _need_postgres()
    cluster = PostgresCluster(tempfile.mkdtemp(prefix="memprune-pg-")).init().start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresCluster) -> str:
    """A fresh, empty database on the session's PostgreSQL server (its SQLAlchemy URL)."""
    return postgres_server.create_db("t_" + uuid.uuid4().hex[:12])


@pytest.fixture
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster of this test alone (``postgres_server``'s requirements and skips), to restart."""
    _need_postgres()
    cluster = PostgresCluster(tempfile.mkdtemp(prefix="memprune-pg-")).init().start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(cluster.root, ignore_errors=True)
