"""``memprune run -- COMMAND``: unchanged Python programs run as real processes with every Optuna study they
make guarded; their output and exit status kept; one clear line for each bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest

from optuna_memprune import records, storages
from optuna_memprune.units import format_bytes

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = str(HERE.parent.parent)


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = HERE) -> subprocess.CompletedProcess:
    """``python -m optuna_memprune.cli run ARGS`` in this directory, the package importable from the checkout."""
    base = {k: v for k, v in os.environ.items() if k not in (storages.ENV_VAR, "MEMPRUNE_RUN")}
    path = os.pathsep.join(p for p in (PACKAGE_ROOT, base.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "run", *args],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": path, **(env or {})},
        cwd=cwd,
        timeout=600,
    )


def memprune_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("memprune: ")]


def guarded_trials(url: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="example", storage=storages.open_storage(url, existing=True))
    return study.get_trials(deepcopy=False)


def test_the_readme_example_without_guard_code_gets_a_record_on_every_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'example.db'}"
    plain = subprocess.run([sys.executable, "example_study.py", "-"], capture_output=True, text=True, cwd=HERE)
    proc = run("--ram", "2GiB", "--footprint", "footprints:fits", "--", sys.executable, "example_study.py", url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout  # the program's own output, unchanged
    trials = guarded_trials(url)
    assert len(trials) == 4
    decisions = [records.read(t.user_attrs).decision.value for t in trials]
    assert decisions[0] == "unchecked" and set(decisions[1:]) == {"admitted"}, decisions  # trial 0: space unknown
    assert all(records.read(t.user_attrs).pred_ram for t in trials[1:])
    lines = memprune_lines(proc.stderr)
    assert lines[0] == (
        "memprune: guarding study 'example': budget Budget(ram=2.00 GiB), footprint: footprints:fits"
    ), lines
    assert lines[-1] == (
        f"memprune: 4 trials guarded in study 'example' (admitted 3, clamped 0, rejected 0, "
        f"stopped 0, unchecked 1); memprune report {url} --study-name example"
    ), lines


def test_the_program_exit_status_is_kept_and_the_summary_still_printed(tmp_path: Path) -> None:
    proc = run("--ram", "2GiB", "--", sys.executable, "example_study.py", "-", "1", "3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("best ")
    last = memprune_lines(proc.stderr)[-1]
    assert last.startswith(
        "memprune: 4 trials guarded in study 'example' (admitted 0, clamped 0, rejected 0, "
        "stopped 0, unchecked 4); footprint: none declared"
    ), last
    assert "the study was in memory" in last


@pytest.mark.parametrize("storage, options", [("sqlite", []), ("-", ["--workers", "2"])])
def test_parallel_jobs_run_one_process_per_trial_on_a_shared_storage_and_say_so(storage, options, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}" if storage == "sqlite" else "-"
    jobs = ["2"] if storage == "sqlite" else ["1"]  # n_jobs=2 in the program, or n_jobs=1 with --workers 2
    proc = run(
        "--ram",
        "2GiB",
        *options,
        "--footprint",
        "footprints:fits",
        "--",
        sys.executable,
        "example_study.py",
        url,
        *jobs,
        env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0 and proc.stdout.startswith("best "), proc.stderr  # the program's study has them
    lines = memprune_lines(proc.stderr)
    said = [line for line in lines if "2 jobs run as one process per trial (2 at a time" in line]
    assert len(said) == 1, lines
    if storage == "-":  # an in-memory study: its trials ran on a journal file memprune run made, and said where
        url = said[0].rsplit("a journal file made for the in-memory study: ", 1)[1]
        assert url.startswith(str(tmp_path / "cache" / "runs")) and url.endswith(".log"), said
    trials = guarded_trials(url)
    recs = [records.read(t.user_attrs) for t in trials]
    assert len(trials) == 4 and all(r is not None and r.host and r.enforcement for r in recs), recs  # the runner's
    assert all(r.peak_ram and r.peak_ram < 2 * 2**30 for r in recs), recs
    assert lines[-1].startswith("memprune: 4 trials guarded in study 'example'") and lines[-1].endswith(
        f"memprune report {url} --study-name example"
    ), lines


def _ran_once(proc: subprocess.CompletedProcess, marks: Path, status: int) -> list[str]:
    """The checks every run of a script without a main guard passes: the program's exit status, its top level run
    once, each of its 6 trials run once and recorded; returns memprune's lines."""
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    lines = marks.read_text().splitlines()
    assert [line.split()[0] for line in lines].count("top") == 1, lines  # the program ran once, not once per trial
    trials = sorted(line.rsplit(" ", 1)[0] for line in lines if line.startswith("trial "))
    assert trials == [f"trial {n}" for n in range(6)], lines  # each trial's objective ran exactly once
    shown = json.loads(proc.stdout.splitlines()[-1])
    assert [(t["number"], t["state"], t["record"]) for t in shown] == [(n, "COMPLETE", True) for n in range(6)], shown
    return memprune_lines(proc.stderr)


@pytest.mark.parametrize(
    "script, status", [("unguarded_helper.py", 0), ("unguarded_helper.py", 3), ("unguarded_jobs.py", 5)]
)
def test_a_script_without_a_main_guard_runs_once_with_one_process_per_trial(script, status, tmp_path) -> None:
    marks = tmp_path / "marks"
    proc = run(
        "--ram",
        "2GiB",
        "--",
        sys.executable,
        script,
        str(marks),
        str(status),
        env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")},
    )
    lines = _ran_once(proc, marks, status)
    assert sum("2 jobs run as one process per trial" in line for line in lines) == 1, lines
    assert len({line.split()[-1] for line in marks.read_text().splitlines()}) > 2  # trials ran in their own processes
    assert lines[-1].startswith("memprune: 6 trials guarded in study"), lines


@pytest.mark.parametrize(
    "mode, words",
    [
        ("lock", "the objective cannot be sent to another process: TypeError: cannot pickle '_thread.lock'"),
        (
            "sampler",
            "the study's sampler cannot be sent to another process: UnpicklingError: ScriptSampler is named in "
            "the program's main module",
        ),
    ],
)
def test_what_cannot_cross_keeps_its_threads_under_whole_process_admission(mode, words, tmp_path) -> None:
    marks = tmp_path / "marks"
    proc = run(
        "--ram",
        "2GiB",
        "--",
        sys.executable,
        "unguarded_jobs.py",
        str(marks),
        "7",
        mode,
        env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")},
    )
    lines = _ran_once(proc, marks, 7)
    assert len({line.split()[-1] for line in marks.read_text().splitlines()}) == 1  # one process: threads
    said = [line for line in lines if f"2 jobs run as threads of this process ({words}" in line]
    assert len(said) == 1 and "with whole-process admission" in said[0], lines
    assert (
        lines[-1].startswith("memprune: 6 trials guarded in study")
        and f"; n_jobs=2 ran as threads ({words}" in lines[-1]
    ), lines


@pytest.mark.parametrize("script, given", [("unguarded_helper.py", "option"), ("unguarded_jobs.py", "environment")])
def test_storage_keeps_the_records_of_a_study_the_program_makes_in_memory(script, given, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    options, env = (["--storage", url], {}) if given == "option" else ([], {storages.ENV_VAR: url})
    marks = tmp_path / "marks"
    proc = run(
        "--ram",
        "2GiB",
        *options,
        "--",
        sys.executable,
        script,
        str(marks),
        "0",
        env={**env, "MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")},
    )
    lines = _ran_once(proc, marks, 0)
    assert not (tmp_path / "cache" / "runs").exists() or not any((tmp_path / "cache" / "runs").iterdir()), lines
    (name,) = optuna.get_all_study_names(url)  # the program's study, after the program ended
    trials = optuna.load_study(study_name=name, storage=url).trials
    recs = [records.read(t.user_attrs) for t in trials]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6 and all(r is not None and r.peak_ram for r in recs)
    assert lines[-1].endswith(
        f"the program made it in memory: its records are on --storage {url}; memprune report {url} --study-name {name}"
    ), lines


def test_a_study_put_on_the_storage_keeps_the_numpy_attrs_an_in_memory_one_held(tmp_path: Path) -> None:
    # Optuna's terminator example reports cross_val_score's numpy array: an in-memory study holds it, a
    # database keeps JSON. On the study --storage made, its first trial failed and the program ended.
    url, marks = f"sqlite:///{tmp_path / 'kept.db'}", tmp_path / "marks"
    proc = run(
        "--ram", "2GiB", "--storage", url, "--", sys.executable, "unguarded_jobs.py", str(marks), "0", "attrs",
        env={"MEMPRUNE_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    _ran_once(proc, marks, 0)  # n_jobs=2: each trial in a process of its own, the storage pickled to it
    (name,) = optuna.get_all_study_names(url)
    for t in optuna.load_study(study_name=name, storage=url).trials:
        assert t.user_attrs["rows_seen"] == [0, t.params["rows"], 2 * t.params["rows"]], t.user_attrs
        assert [0.5, 0.25, 0.75] in t.system_attrs.values(), t.system_attrs


def test_data_the_objective_holds_crosses_once_per_trial_by_a_file_removed_at_the_end(tmp_path: Path) -> None:
    """A script's 200 MiB array that its objective reads goes with the objective by value: each trial's process
    reads it from one file instead of getting a copy of its bytes through the fork server's pipe beside the
    array they make (trials peaked at twice the data, and were clamped for it); the file goes when the call
    returns."""
    url, marks = f"sqlite:///{tmp_path / 'kept.db'}", tmp_path / "marks"
    tmp = Path(tempfile.mkdtemp())  # short: the fork server's socket is made there too (108 bytes at most)
    env = {"MEMPRUNE_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp)}
    try:
        proc = run(
            "--ram",
            "2GiB",
            "--storage",
            url,
            "--",
            sys.executable,
            "unguarded_jobs.py",
            str(marks),
            "0",
            "data",
            env=env,
        )
        left = [p.name for p in tmp.iterdir() if p.name.startswith("memprune-objective-")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _ran_once(proc, marks, 0)
    (name,) = optuna.get_all_study_names(url)
    peaks = [records.read(t.user_attrs).peak_ram for t in optuna.load_study(study_name=name, storage=url).trials]
    data = 200 * 2**20
    # a trial's process: its interpreter and libraries (about 90 MiB here), the data once, its own small arrays
    assert all(data < p < data + 200 * 2**20 for p in peaks), [format_bytes(p) for p in peaks]
    assert not left


def test_a_study_the_program_makes_itself_on_a_guarded_study_is_guarded_with_its_own_sampler(tmp_path: Path) -> None:
    # optuna-integration's LightGBMTuner runs each step on a Study it makes (not create_study) with a sampler it
    # sets: its 65 trials ran unguarded, the summary said "0 trials guarded" and nothing more.
    url = f"sqlite:///{tmp_path / 'steps.db'}"
    proc = run("--ram", "1GiB", "--", sys.executable, "stepwise_study.py", url)
    assert proc.returncode == 0, proc.stderr
    ran = [line.split(" ", 2) for line in proc.stdout.splitlines()]
    # every point fits (1-64 MiB under 1 GiB): the bound at rows=32 was 929 MiB before a reading's noise was
    # taken as a share of the process's usage, not of the increments' base, and rejected it at this budget
    assert [(n, s) for n, s, _ in ran] == [(str(i), "COMPLETE") for i in range(7)], proc.stdout
    steps = [sorted(p for *_, p in ran[i:j]) for i, j in ((0, 3), (3, 5), (5, 7))]
    assert steps == [  # each step's grid point once
        ["{'rows': 16}", "{'rows': 1}", "{'rows': 48}"],
        ["{'cols': 2}", "{'cols': 3}"],
        ["{'rows': 2}", "{'rows': 32}"],
    ], proc.stdout
    recs = [records.read(t.user_attrs) for t in optuna.load_study(study_name="steps", storage=url).trials]
    assert all(r is not None for r in recs), recs
    lines = memprune_lines(proc.stderr)
    assert sum("guarding study 'steps'" in line for line in lines) == 1, lines
    assert lines[-1].startswith("memprune: 7 trials guarded in study 'steps'"), lines


def test_a_study_the_program_gives_a_storage_keeps_it(tmp_path: Path) -> None:
    own, other = f"sqlite:///{tmp_path / 'own.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    proc = run("--ram", "2GiB", "--storage", other, "--", sys.executable, "example_study.py", own)
    assert proc.returncode == 0, proc.stderr
    assert len(guarded_trials(own)) == 4 and optuna.get_all_study_names(other) == []
    assert memprune_lines(proc.stderr)[-1].endswith(f"memprune report {own} --study-name example"), proc.stderr


def test_a_named_study_already_on_the_storage_is_a_new_one_with_the_time_appended(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'named.db'}"
    for _ in range(2):
        proc = run("--ram", "2GiB", "--storage", url, "--", sys.executable, "example_study.py", "-")
        assert proc.returncode == 0 and proc.stdout.startswith("best "), proc.stderr
    names = optuna.get_all_study_names(url)
    assert len(names) == 2 and names[0] == "example" and names[1].startswith("example-"), names
    assert f"has a study 'example' already: this run's is {names[1]!r}" in proc.stderr, proc.stderr
    assert all(len(optuna.load_study(study_name=n, storage=url).trials) == 4 for n in names)


def test_auto_takes_the_footprint_the_program_declares() -> None:
    proc = run("--ram", "2GiB", "--", sys.executable, "declared_study.py")
    assert proc.returncode == 0 and proc.stdout == "declared done\n", proc.stderr
    lines = memprune_lines(proc.stderr)
    assert lines[0].endswith("footprint: the program's memprune_footprint"), lines
    assert lines[-1].startswith("memprune: 3 trials guarded in study") and "admitted 2" in lines[-1], lines


def test_a_footprint_that_raises_runs_its_trials_unchecked_with_the_guards_warning(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raises.db'}"
    proc = run("--ram", "2GiB", "--footprint", "footprints:raises", "--", sys.executable, "example_study.py", url)
    assert proc.returncode == 0, proc.stderr
    assert "The footprint failed on 3 trials in a row" in proc.stderr
    reasons = [records.read(t.user_attrs).reason for t in guarded_trials(url)]
    assert all(
        r.startswith("the footprint function failed: RuntimeError: this footprint is broken") for r in reasons[1:]
    ), reasons  # trial 0 ran before the space was known: no prediction after it


def test_trials_an_ask_and_tell_loop_makes_are_said_to_run_unguarded() -> None:
    # An ask-and-tell loop gives the guard no objective to wrap: its trials ran with no word but "0 trials
    # guarded" at the end. Now the first is named when it is made, and the summary counts them.
    proc = run("--ram", "2GiB", "--", sys.executable, "ask_tell_study.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "5 trials\n"  # the program's own output, unchanged
    lines = memprune_lines(proc.stderr)
    said = [line for line in lines if "was made with study.ask(), outside study.optimize" in line]
    assert len(said) == 1 and said[0].startswith("memprune: trial 0 of study "), lines
    summary = lines[-1]
    assert "2 trials guarded" in summary, summary  # Optuna's own ask() inside optimize is not counted
    assert "; 3 trials made with study.ask() outside study.optimize ran unguarded" in summary, summary


def test_a_program_that_creates_no_study_says_so_and_keeps_its_status() -> None:
    proc = run("--ram", "2GiB", "--", sys.executable, "no_study.py")
    assert proc.returncode == 4 and proc.stdout == "no study here\n"
    assert memprune_lines(proc.stderr) == ["memprune: the program created no Optuna study; nothing was guarded"]


def test_child_processes_of_the_program_are_not_guarded() -> None:
    proc = run("--ram", "2GiB", "--", sys.executable, "child_studies.py")
    assert proc.returncode == 0, proc.stderr
    seen = {d["how"]: d for d in map(json.loads, proc.stdout.splitlines())}
    assert seen["parent"]["sampler"] == "GuardedSampler"
    for how in ("spawn", "forkserver", "fork", "subprocess"):
        assert seen[how]["sampler"] == "TPESampler" and not seen[how]["env"], seen[how]
    assert sum("guarding study" in line for line in memprune_lines(proc.stderr)) == 1, proc.stderr


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nprint('their sitecustomize ran', file=sys.stderr)\n")
    env = {"PYTHONPATH": os.pathsep.join((str(tmp_path), PACKAGE_ROOT))}
    proc = run("--ram", "2GiB", "--", sys.executable, "no_study.py", env=env)
    assert proc.returncode == 4 and "their sitecustomize ran" in proc.stderr, proc.stderr
    assert "nothing was guarded" in proc.stderr


def test_a_script_given_alone_runs_with_this_interpreter() -> None:
    proc = run("--ram", "2GiB", "--", "no_study.py")
    assert proc.returncode == 4 and "nothing was guarded" in proc.stderr, proc.stderr


def test_dry_run_prints_what_it_would_guard_and_runs_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dry.db'}"
    proc = run("--ram", "3GiB", "--dry-run", "--", sys.executable, "example_study.py", url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"memprune run would guard: {sys.executable} example_study.py {url}",
        "budget: Budget(ram=3.00 GiB) (the program's process)",
        "footprint: auto: the program's own memprune_footprint(params) if its main module defines one, else a "
        "footprint learned from the study's own trials (its first trials run unchecked under the monitor)",
    ]
    assert not (tmp_path / "dry.db").exists()
    data = json.loads(run("--ram", "3GiB", "--dry-run", "-f", "json", "--", "no_study.py").stdout)
    assert data["budget"] == {"ram": 3 * 2**30} and data["command"] == [sys.executable, "no_study.py"]


def _one_line(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("memprune: error: ") and words in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "command, words",
    [
        (["ls", "-l"], "COMMAND must be a Python program"),
        (["run_me.sh"], "COMMAND must be a Python program"),
        ([], "give the command to run after --"),
        ([sys.executable], "runs no script, -m module or -c code"),
        ([sys.executable, "-I", "no_study.py"], "skips the startup hook"),
        ([sys.executable, "-m"], "needs a value"),
    ],
)
def test_a_command_that_is_not_a_python_program_is_one_line_and_nothing_runs(command, words, tmp_path) -> None:
    (tmp_path / "run_me.sh").write_text("#!/bin/sh\ntouch ran\n")
    (tmp_path / "run_me.sh").chmod(0o755)
    _one_line(run("--ram", "2GiB", "--", *command, cwd=tmp_path), words)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "options, words",
    [
        (["--footprint", "no_such_module:f"], "--footprint 'no_such_module:f' cannot be imported: ModuleNotFoundError"),
        (["--footprint", "footprints:nope"], "has no attribute 'nope'"),
        (["--footprint", "footprints:NOT_A_FUNCTION"], "is a int, not a function"),
        (["--footprint", "rl-zoo3x"], "--footprint must be auto, learned, none, a recipe"),
        (["--footprint", "sb3"], "the recipe cannot guard a command"),
        ([], "give the budget"),
        (["--ram", "1MiB"], "Budget.ram must be at least 32 MiB"),
        (["--ram", "34MiB"], "RAM soft line"),
        (["--threads", "2"], "Budget.threads must be at least 3"),
        (["--ram", "lots"], "ram"),
        (["--workers", "0"], "--workers"),
        (["--clamp-fixed", "buffer_size"], "--clamp-fixed lowers the fixed hyperparameters of an rl-zoo3 search"),
        (["--storage", "nope://x"], "--storage 'nope://x' cannot be opened: NoSuchModuleError"),
        (
            ["--storage", "x.db"],
            "--storage 'x.db' cannot be opened: ArgumentError: Could not parse SQLAlchemy URL from "
            "given URL string (a SQLite file is written sqlite:///x.db, a Journal file PATH.log or journal:PATH)",
        ),
        (
            ["--storage", "sqlite:////no/such/dir/x.db"],
            "--storage 'sqlite:////no/such/dir/x.db' cannot be opened: StorageError: cannot create the SQLite file",
        ),
    ],
)
def test_bad_options_are_one_line_before_anything_runs(options: list[str], words: str, tmp_path: Path) -> None:
    budget = [] if any(o in options for o in ("--ram", "--threads")) or options == [] else ["--ram", "2GiB"]
    _one_line(run(*budget, *options, "--", sys.executable, "example_study.py", f"sqlite:///{tmp_path / 'x.db'}"), words)
    assert not (tmp_path / "x.db").exists()


def test_a_bad_optuna_storage_variable_is_named_as_the_default_of_storage() -> None:
    _one_line(
        run("--ram", "2GiB", "--", sys.executable, "no_study.py", env={storages.ENV_VAR: "nope://x"}),
        f"${storages.ENV_VAR} (the default of --storage) 'nope://x' cannot be opened",
    )


def test_learned_runs_its_warm_up_under_the_monitor_and_the_records_say_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'learned.db'}"
    proc = run("--ram", "2GiB", "--footprint", "learned", "--", sys.executable, "example_study.py", url)
    assert proc.returncode == 0, proc.stderr
    last = memprune_lines(proc.stderr)[-1]
    assert "unchecked 4" in last, last
    assert "footprint: a footprint learned from the study's own trials" in proc.stderr, proc.stderr
    assert "The footprint failed" not in proc.stderr  # no footprint by design is no failure
    trials = optuna.load_study(study_name="example", storage=url).trials
    learned = [records.read(t.user_attrs).learned for t in trials]
    assert len(learned) == 4 and all(x.get("phase") == "warm-up" for x in learned), learned


def test_rl_zoo3_is_recognised_and_its_recipe_looked_up_in_the_registry() -> None:
    pytest.importorskip("rl_zoo3", reason="rl_zoo3 is not importable (the test extra installs rl-zoo3==2.9.2)")
    proc = run(
        "--ram",
        "3GiB",
        "--dry-run",
        "--",
        sys.executable,
        "-m",
        "rl_zoo3.train",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "-optimize",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2] == "footprint: auto: the rlzoo3 recipe (estimate.recipes)"
    assert "footprint of the default params" in proc.stdout and "infeasible" not in proc.stdout
    named = run("--ram", "3GiB", "--dry-run", "--footprint", "rl-zoo3", "--", sys.executable, "-m", "rl_zoo3.train")
    assert named.returncode == 0 and "footprint: the rlzoo3 recipe" in named.stdout, named.stdout + named.stderr


def _pong_ram(*buffer_sizes: int) -> list[int]:
    """The rl-zoo3 recipe's RAM for DQN on Pong at these buffer sizes, computed in a fresh process that reads
    the same calibration cache file as ``memprune run`` did, without a recheck (this test process may hold
    figures read before another process rechecked the file)."""
    code = (
        "import sys; from optuna_memprune.estimate import recipes; print(*(recipes.rlzoo3('dqn', "
        "'PongNoFrameskip-v4', hyperparams={'buffer_size': int(b)}).ram for b in sys.argv[1:]))"
    )
    base = {k: v for k, v in os.environ.items() if k != "MEMPRUNE_RUN"}
    path = os.pathsep.join(p for p in (PACKAGE_ROOT, base.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, buffer_sizes)],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": path, "MEMPRUNE_RECHECK": "0"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return [int(x) for x in proc.stdout.split()]


def test_a_fixed_hyperparameter_that_no_trial_fits_is_named_with_the_largest_value_that_fits() -> None:
    pytest.importorskip("rl_zoo3", reason="rl_zoo3 is not importable (the test extra installs rl-zoo3==2.9.2)")
    proc = run(
        "--ram",
        "4GiB",
        "--dry-run",
        "--",
        sys.executable,
        "-m",
        "rl_zoo3.train",
        "--algo",
        "dqn",
        "--env",
        "PongNoFrameskip-v4",
        "-optimize",
        env={"MEMPRUNE_RECHECK": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[-1]
    found = re.fullmatch(
        r"every trial of this search is infeasible: buffer_size 100000 needs ([0-9.]+) GiB at "
        r"3\.60 GiB; ([0-9]+) fits \(the soft line, 90% of the 4\.00 GiB budget\): "
        r"pass -params buffer_size:\2",
        line,
    )  # the zoo's yml value against the soft line
    assert found, line
    fits, soft = int(found[2]), 0.9 * 4 * 2**30
    need, fitting = _pong_ram(100000, fits)  # the figures of the same cache, as the line was computed
    assert abs(float(found[1]) * 2**30 - need) < 0.02 * need, (line, format_bytes(need))
    assert fitting <= soft < need


def test_clamp_fixed_lowers_the_buffer_and_a_replayed_trial_gets_the_same_value(tmp_path: Path) -> None:
    pytest.importorskip("rl_zoo3", reason="rl_zoo3 is not importable (the test extra installs rl-zoo3==2.9.2)")
    zoo = [sys.executable, "-m", "rl_zoo3.train", "--algo", "dqn", "--env", "PongNoFrameskip-v4"]
    proc = run("--ram", "4GiB", "--clamp-fixed", "buffer_size", "--dry-run", "--", *zoo, "-optimize")
    assert proc.returncode == 0, proc.stderr
    found = re.fullmatch(r"--clamp-fixed: buffer_size 100000 -> ([0-9]+) on every trial", proc.stdout.splitlines()[-1])
    assert found and 10_000 < int(found[1]) < 100_000, proc.stdout[-500:]
    url = f"sqlite:///{tmp_path / 'zoo.db'}"  # a trial the search ran with the lowered value, replayed
    study = optuna.create_study(study_name="pong", storage=url)
    trial = study.ask()
    records.write_overrides(study, trial._trial_id, {"buffer_size": (100000, int(found[1]))})
    study.tell(trial, 1.0)
    replay = run("--ram", "4GiB", "--dry-run", "--", *zoo, "--storage", url, "--study-name", "pong", "--trial-id", "0")
    assert replay.returncode == 0, replay.stderr
    assert memprune_lines(replay.stderr) == [
        f"memprune: trial 0 ran with buffer_size 100000 -> {found[1]} "
        f"(--clamp-fixed): replayed with -params buffer_size:{found[1]}"
    ]
    assert replay.stdout.splitlines()[0].endswith(f"--trial-id 0 -params buffer_size:{found[1]}"), replay.stdout
