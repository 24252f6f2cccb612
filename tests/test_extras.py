"""The core install without its extras: a call that needs a missing extra says which in one line; the
terminal output works without rich. Each missing module is blocked (``sys.modules[name] = None``), as where
its extra was not installed; the core-only install itself is checked by ``scripts/core_check.sh`` in CI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from optuna_memprune._console import Table
from optuna_memprune._extras import MissingExtra
from optuna_memprune.runner._progress import Progress, Status


def _blocked(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run with ``modules`` blocked, and without the calibration recheck (test_recheck's subject): a
    command reading the suite's cache once it is 10 minutes old would probe first (a fresh interpreter, where
    nothing is blocked) and, under the suite's load, might add a warning line to the one-line errors checked
    here."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    env = {**os.environ, "MEMPRUNE_RECHECK": "0"}
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120, env=env)


def test_the_tracer_without_torch_names_the_torch_extra() -> None:
    out = _blocked(["torch"], "from optuna_memprune.estimate import torch_training")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "optuna_memprune._extras.MissingExtra: estimate.torch_training needs torch, which is not installed: "
        'pip install "optuna-memprune[torch]"'
    )


def test_a_command_without_its_extra_is_one_line_naming_it() -> None:
    # the rl extra (sb3-contrib here) installed but torch not: the recipe names torch, not what imported it
    out = _blocked(
        ["torch"],
        "from optuna_memprune.cli import main\n"
        "sys.exit(main(['-q', 'predict', 'sb3', '--algo', 'qrdqn', '--env', 'CartPole-v1']))",
    )
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        "memprune: error: the sb3 recipe's qrdqn needs torch, which is not installed: "
        'pip install "optuna-memprune[torch]"\n'
    )
    out = _blocked(
        ["gymnasium", "stable_baselines3", "sb3_contrib"],
        "from optuna_memprune.cli import main\n"
        "sys.exit(main(['-q', 'predict', 'sb3', '--algo', 'dqn', '--env', 'CartPole-v1']))",
    )
    assert out.returncode == 2 and out.stderr.endswith(
        'needs gymnasium and stable-baselines3, which are not installed: pip install "optuna-memprune[rl]"\n'
    )


def test_only_a_module_an_extra_brings_is_called_a_missing_extra() -> None:
    assert MissingExtra.of(ModuleNotFoundError("No module named 'lightgbm'", name="lightgbm"), "x") is None
    assert MissingExtra.of(ImportError("cannot import name 'y'"), "x") is None  # no module name: a real error
    missing = MissingExtra.of(ModuleNotFoundError(name="rich.console"), "the table")
    assert isinstance(missing, ImportError)  # callers that catch ImportError still do
    assert str(missing) == 'the table needs rich, which is not installed: pip install "optuna-memprune[report]"'


def test_progress_without_rich_prints_plain_lines_on_stderr(monkeypatch, capsys) -> None:
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")] or ["rich"]:
        monkeypatch.setitem(sys.modules, name, None)
    status = Status(running=1, done=3, rejected=1, pruned=1, failed=0, host_ram=2**30, host_capacity=2**32)
    with Progress(lambda: status, total=8) as bar:
        bar.update()  # the first update prints; later ones wait their 10 s
        bar.update()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2  # the first update and the end
    assert err[-1].startswith("memprune 4/8 ")
    assert err[-1].endswith("running 1 · done 3 · rejected 1 · pruned 1 · failed 0 · host RAM 1.00 GiB / 4.00 GiB")


def test_the_plain_table_aligns_columns_and_stacks_a_cells_lines() -> None:
    t = Table(title="t")
    t.add_column("name")
    t.add_column("RAM", justify="right")
    t.add_row("a", "1 MiB")
    t.add_row("bb", "RAM 10 MiB\nVRAM 2 GiB")
    assert str(t).splitlines() == ["t", "name         RAM", "a          1 MiB", "bb    RAM 10 MiB", "      VRAM 2 GiB"]


def test_the_cli_names_the_extra_for_its_own_commands_only(monkeypatch, capsys) -> None:
    from optuna_memprune import cli

    def fails(args):  # noqa: ANN001, ANN202 - a command whose import of an extra's module fails
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib.figure")

    monkeypatch.setattr(cli, "cmd_report", fails)
    assert cli.main(["report", "sqlite:///x.db"]) == 1
    assert capsys.readouterr().err == (
        "memprune: error: memprune report needs matplotlib, which is not installed: "
        'pip install "optuna-memprune[report]"\n'
    )
    monkeypatch.setattr(cli, "cmd_worker", fails)  # the worker imports the user's objective: its error is its own
    with pytest.raises(ModuleNotFoundError, match="matplotlib"):
        cli.main(["worker", "m:f", "--study", "s", "--storage", "sqlite:///x.db"])
