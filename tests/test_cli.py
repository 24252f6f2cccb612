"""The ``memprune`` command's conventions (the Optuna CLI's), each through a real process (``-f/--format``, about
the output alone, through the CLI's ``main`` in this process): ``--version``,
``-v``/``-q`` before or after the command, exit statuses (1 runtime, 2 usage, 130 interrupted), ``-f/--format``,
``--study-name`` (``--study``) and ``OPTUNA_STORAGE``, and Journal file storages wherever a URL is taken."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import optuna_memprune
from optuna_memprune import storages

HERE = Path(__file__).resolve().parent
GUARD_TESTS = HERE / "guard"  # _runner_objectives: the objectives and footprint the runner tests use
WORKER = [
    "_runner_objectives:hold",
    "--footprint",
    "_runner_objectives:footprint",
    "--ram",
    "1GiB",
    "--host-ram",
    "4GiB",
    "--no-progress",
]


def memprune(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """``python -m optuna_memprune.cli ARGS`` without ``OPTUNA_STORAGE`` unless ``env`` sets it."""
    base = {k: v for k, v in os.environ.items() if k != storages.ENV_VAR}
    return subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=cwd,
        timeout=600,
        **kwargs,
    )


def in_process(*args: str) -> tuple[int, str]:
    """``memprune ARGS`` run by the CLI's ``main`` in this process (without ``OPTUNA_STORAGE``), for what is not
    about the process itself: its exit status and what it printed on stdout."""
    import contextlib
    import io
    import logging

    from optuna_memprune import cli

    logger = logging.getLogger("optuna_memprune")
    level, out = logger.level, io.StringIO()
    saved = os.environ.pop(storages.ENV_VAR, None)
    try:
        with contextlib.redirect_stdout(out):
            code = cli.main(list(args))
    finally:
        logger.setLevel(level)  # main sets the package's log level for its process
        if saved is not None:
            os.environ[storages.ENV_VAR] = saved
    return code, out.getvalue()


def one_line_error(proc: subprocess.CompletedProcess, code: int, words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("memprune: error: ") and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Journal file holding study 's': two guarded trials run by ``memprune worker --storage PATH.log``."""
    d = tmp_path_factory.mktemp("journal")
    proc = memprune(
        "worker",
        *WORKER,
        "--storage",
        str(d / "study.log"),
        "--study-name",
        "s",
        "--n-trials",
        "2",
        "--ledger",
        f"sqlite:///{d / 'ledger.sqlite'}",
        cwd=GUARD_TESTS,
    )
    assert proc.returncode == 0, proc.stderr
    return d / "study.log"


def test_version() -> None:
    proc = memprune("--version")
    assert proc.returncode == 0 and proc.stdout == f"memprune {optuna_memprune.__version__}\n"


def test_verbosity_options_are_taken_before_and_after_the_command(journal: Path) -> None:
    outs = [
        memprune(*argv)
        for argv in (
            ["-q", "report", str(journal), "-f", "json"],
            ["report", str(journal), "-f", "json", "-q"],
            ["report", "-v", str(journal), "--format", "json"],
        )
    ]
    assert all(p.returncode == 0 for p in outs), [p.stderr for p in outs]
    assert outs[0].stdout == outs[1].stdout == outs[2].stdout and json.loads(outs[0].stdout)["study"]["name"] == "s"
    both = memprune("report", str(journal), "-v", "-q")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_quiet_hides_the_calibration_notes_and_verbose_after_the_command_keeps_them(tmp_path: Path) -> None:
    from optuna_memprune.estimate import calibration, recipes

    cal, _, _ = recipes.calibrate()  # the stacks measured (cached) here; each run below measures the kernels
    for name in ("quiet", "verbose"):
        seeded = tmp_path / name / cal.path.name
        seeded.parent.mkdir()
        seeded.write_text(json.dumps({k: v for k, v in cal.data.items() if k != "cpu_kernels"}))
    quiet = memprune("calibrate", "-q", env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "quiet")})
    verbose = memprune("calibrate", "-v", env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "verbose")})
    assert quiet.returncode == verbose.returncode == 0, (quiet.stderr, verbose.stderr)
    assert "Calibrating CPU kernel workspaces" not in quiet.stderr
    assert "Calibrating CPU kernel workspaces" in verbose.stderr
    # The stacks: read, not measured (each line ends with when it was measured and rechecked: a recheck in
    # either run notes its own minute).
    stacks = [[line.split("  measured ")[0] for line in run.stdout.splitlines()[:-1]] for run in (quiet, verbose)]
    assert stacks[0] == stacks[1]
    assert all(
        re.search(r"  measured (\d{4}-\d\d-\d\d \d\d:\d\d UTC|-), rechecked (\d{4}-.* UTC|-)$", line)
        for line in quiet.stdout.splitlines()[:-1]
    ), quiet.stdout
    assert calibration.load(tmp_path / "quiet" / cal.path.name).data["cpu_kernels"]


def test_runtime_errors_exit_1_and_usage_errors_exit_2(tmp_path: Path) -> None:
    one_line_error(memprune("report", f"sqlite:///{tmp_path / 'absent.db'}"), 1, "no SQLite file at ")
    one_line_error(memprune("report", str(tmp_path / "absent.log")), 1, "no Journal file at ")
    not_journal = tmp_path / "notes.log"
    not_journal.write_text("not a journal\n")
    one_line_error(memprune("report", f"journal:{not_journal}"), 1, "holds no studies")  # Optuna skips bad lines
    one_line_error(memprune("predict", "sb3", "--algo", "dqn", "--env", "CartPole-v1", "buffer_sz=1"), 2, "buffer_sz")
    one_line_error(memprune("report"), 2, f"give the study's storage URL (or set {storages.ENV_VAR})")
    one_line_error(memprune("worker", *WORKER, "--study-name", "s", cwd=GUARD_TESTS), 2, storages.ENV_VAR)
    bad_choice = memprune("report", "x.log", "-f", "xml")
    assert bad_choice.returncode == 2 and "invalid choice: 'xml'" in bad_choice.stderr
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "absent.log").exists()


def test_ctrl_c_exits_130_without_a_traceback(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "optuna_memprune.cli",
            "worker",
            "_runner_objectives:wait_to_be_killed",
            *WORKER[1:],
            "--storage",
            str(tmp_path / "s.log"),
            "--study-name",
            "s",
            "--n-trials",
            "1",
            "--ledger",
            f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        ],
        cwd=GUARD_TESTS,
        env={**os.environ, "MEMPRUNE_TEST_MARKER": str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        for _ in range(1200):
            if marker.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the trial never started"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_format_option_on_every_command_that_prints_data(journal: Path) -> None:
    # The options' parsing and the output, not the process: in this process (the others above run as one).
    argv = ["predict", "sb3", "--algo", "ppo", "--env", "CartPole-v1", "n_steps=64"]
    table, as_json, alias = in_process(*argv), in_process(*argv, "-f", "json"), in_process(*argv, "--json")
    assert table[0] == as_json[0] == alias[0] == 0
    assert "TOTAL" in table[1] and as_json[1] == alias[1]
    assert json.loads(as_json[1])["ram"] > 100e6
    before = in_process("predict", "-f", "json", *argv[1:])  # before the recipe, as --json always was
    assert before == (0, as_json[1])
    code, out = in_process("calibrate", "--format", "json")
    assert code == 0
    figures = json.loads(out)
    assert ["gymnasium", "stable_baselines3", "torch"] in [s["imports"] for s in figures["stacks"]]
    assert Path(figures["path"]).is_file() and figures["envs"] == []
    report = in_process("report", str(journal), "-f", "json")
    assert report[0] == 0 and json.loads(report[1])["study"]["name"] == "s"
    assert report == in_process("report", str(journal), "--format", "json")


def test_study_name_and_its_alias_and_the_optuna_storage_fallback(journal: Path, tmp_path: Path) -> None:
    env = {storages.ENV_VAR: str(journal)}
    named = memprune("report", "-f", "json", "--study-name", "s", env=env)
    alias = memprune("report", "-f", "json", "--study", "s", env=env)
    assert named.returncode == alias.returncode == 0, named.stderr
    assert named.stdout == alias.stdout and json.loads(named.stdout)["study"]["n_guarded"] == 2
    one_line_error(memprune("report", "--study-name", "nope", env=env), 1, "no study 'nope' in ")
    # the worker takes the storage from the environment too; ``journal:PATH`` names a Journal file
    other = tmp_path / "other.journal"
    worker = memprune(
        "worker",
        *WORKER,
        "--study",
        "t",
        "--n-trials",
        "1",
        "--ledger",
        f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        cwd=GUARD_TESTS,
        env={storages.ENV_VAR: f"journal:{other}"},
    )
    assert worker.returncode == 0, worker.stderr
    report = memprune("report", f"journal:{other}", "-f", "json")
    assert report.returncode == 0 and json.loads(report.stdout)["study"]["name"] == "t"


def test_journal_and_rdb_storages_give_the_same_report(journal: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name="s", from_storage=storages.open_storage(str(journal)), to_storage=url)
    outs = [memprune("report", where, "-f", "json") for where in (str(journal), f"journal:{journal}", url)]
    assert all(p.returncode == 0 for p in outs), [p.stderr for p in outs]
    reports = [json.loads(p.stdout) for p in outs]
    assert reports[0] == reports[1] and reports[0]["trials"] == reports[2]["trials"]


def test_a_sqlite_file_given_as_a_path_is_read_and_a_path_of_none_is_told_the_url(
    journal: Path, tmp_path: Path
) -> None:
    # "memprune report study.db" is what a newcomer types: an existing SQLite file is read as sqlite:///PATH
    db = tmp_path / "copy.db"
    optuna.copy_study(
        from_study_name="s", from_storage=storages.open_storage(str(journal)), to_storage=f"sqlite:///{db}"
    )
    by_url, by_path = (memprune("report", where, "-f", "json") for where in (f"sqlite:///{db}", str(db)))
    assert by_path.returncode == 0, by_path.stderr
    assert json.loads(by_path.stdout)["trials"] == json.loads(by_url.stdout)["trials"]
    (tmp_path / "notes.db").write_text("not a database")
    for where in (tmp_path / "new.db", tmp_path / "notes.db"):  # no file, and a file that is no SQLite one
        proc = memprune("report", str(where))
        assert proc.returncode == 1 and f"(a SQLite file is written sqlite:///{where}," in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "url, path",
    [
        ("journal:/a/b.log", "/a/b.log"),
        ("journal:b.txt", "b.txt"),
        ("runs/study.log", "runs/study.log"),
        ("sqlite:///x.log", None),
        ("postgresql+psycopg://u@h/db", None),
    ],
)
def test_journal_urls(url: str, path: str | None) -> None:
    assert storages.journal_path(url) == path
