"""A throwaway PostgreSQL cluster on 127.0.0.1: the one helper the tests (tests/conftest.py) and the fault
drill (scripts/bench_faults.py) start their servers with.

Needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``; ``.ci/run`` installs them). The server refuses to
run as root, so as root it runs as the ``postgres`` user. ``stop`` and ``start`` again keep the port.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path


def pg_bin(name: str) -> str | None:
    """``initdb`` or ``pg_ctl``: on the PATH, else Debian's versioned folder (the newest); None if neither."""
    return shutil.which(name) or (sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [None])[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    """A cluster in ``root`` (made by :meth:`init`), listening on a free local port with ``fsync=off``;
    ``options`` are more ``-c name=value`` server settings, ``env`` the environment of its commands."""

    def __init__(
        self, root: str | Path, *, max_connections: int = 200, options: str = "", env: dict[str, str] | None = None
    ) -> None:
        self.root, self.data = Path(root), Path(root) / "data"
        self.port, self.env = free_port(), env
        self.settings = f"-c listen_addresses=127.0.0.1 -c max_connections={max_connections} -c fsync=off {options}"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.started = False

    def _run(self, *cmd: str, check: bool = True, timeout: float = 120) -> None:
        subprocess.run(
            [*self.as_user, *cmd],
            check=check,
            timeout=timeout,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _bin(self, name: str) -> str:
        found = pg_bin(name)
        if found is None:
            raise FileNotFoundError(f"PostgreSQL's {name} was not found (apt-get install postgresql)")
        return found

    def init(self) -> "PostgresCluster":
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(self._bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        return self

    def start(self) -> "PostgresCluster":
        self.started = True
        self._run(
            self._bin("pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-t",
            "120",
            "-l",
            str(self.root / "log"),
            "-o",
            f"-p {self.port} -k {self.root} {self.settings}",
            "start",
            timeout=150,
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(
            self._bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False, timeout=90
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_db(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url().replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
