"""The command ``memprune run`` executes, classified: a Python interpreter with its flags, a ``.py`` file or a
script with a python shebang (``Program``); anything else, and the flags that would skip the startup hook,
refused in one line. Knows nothing of the guard or the environment it hands the program.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The module that runs an rl-zoo3 search (``python -m rl_zoo3.train``).
RLZOO3_TRAIN = "rl_zoo3.train"

_PYTHON = re.compile(r"^python[0-9.]*$")
_FLAGS_WITH_VALUE = "WX"  # -W arg, -X arg
_REFUSED = {"I": "-I (isolated mode)", "E": "-E (ignores PYTHON* variables)", "S": "-S (no site import)"}


@dataclass(frozen=True)
class Program:
    """The command ``memprune run`` executes: ``argv``, and what it runs: ``kind`` ``"module"``
    (``python -m``), ``"script"`` or ``"code"`` (``python -c``), ``target`` (the module, the script's path
    or ``-c``) and ``args`` (the program's own arguments)."""

    argv: tuple[str, ...]
    kind: str
    target: str
    args: tuple[str, ...]

    @property
    def recipe_args(self) -> tuple[str, ...] | None:
        """The arguments of an rl-zoo3 search (``python -m rl_zoo3.train ARGS``, ``rl_zoo3 train ARGS``);
        ``None`` for any other program."""
        if self.kind == "module" and self.target == RLZOO3_TRAIN:
            return self.args
        if self.kind == "script" and Path(self.target).name == "rl_zoo3" and self.args[:1] == ("train",):
            return self.args[1:]
        return None


def python_command(argv: Sequence[str]) -> Program:
    """The program ``argv`` runs, when it is Python; ValueError naming what was given otherwise.

    Examples:
        >>> python_command(["python", "-u", "-m", "rl_zoo3.train", "--algo", "dqn"]).recipe_args
        ('--algo', 'dqn')
        >>> python_command(["ls", "-l"])
        Traceback (most recent call last):
        ...
        ValueError: COMMAND must be a Python program (python ..., python -m MODULE ..., a .py file or a
        script with a python shebang), but got 'ls': nothing was run.
    """
    if not argv:
        raise ValueError("give the command to run after --, e.g. memprune run --ram 4GiB -- python train.py")
    first = str(argv[0])
    if _PYTHON.match(Path(first).name):
        return _interpreter(tuple(map(str, argv)))
    path = Path(first) if os.sep in first or Path(first).is_file() else None
    if path is None:
        found = shutil.which(first)
        path = Path(found) if found else None
    if path is not None and path.is_file():
        rest = tuple(map(str, argv[1:]))
        runs_itself = os.access(path, os.X_OK) and _shebang(path)
        if runs_itself:
            exe = first if os.sep in first else (str(path) if not Path(first).is_file() else f".{os.sep}{first}")
            return Program((exe, *rest), "script", str(path), rest)
        if path.suffix == ".py":
            return Program((sys.executable, first, *rest), "script", first, rest)
    raise ValueError(
        "COMMAND must be a Python program (python ..., python -m MODULE ..., a .py file or a script "
        f"with a python shebang), but got {first!r}: nothing was run."
    )


def _shebang(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            line = f.readline(256)
    except OSError:
        return False
    return line.startswith(b"#!") and b"python" in line


def _interpreter(argv: tuple[str, ...]) -> Program:
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            if token == "--":
                i += 1
            break
        if token.startswith("--"):
            i += 2 if token == "--check-hash-based-pycs" else 1
            continue
        j = 1
        while j < len(token):
            flag = token[j]
            if flag in _REFUSED:
                raise ValueError(
                    f"python {_REFUSED[flag]} skips the startup hook memprune run injects the guard "
                    f"with: run the program without {token!r}"
                )
            if flag in "cm":
                value = token[j + 1 :] or (argv[i + 1] if i + 1 < len(argv) else None)
                if value is None:
                    raise ValueError(f"python {token} needs a value, but the command ends there")
                rest = argv[i + (1 if token[j + 1 :] else 2) :]
                return Program(argv, "module" if flag == "m" else "code", value if flag == "m" else "-c", rest)
            if flag in _FLAGS_WITH_VALUE:
                i += 0 if token[j + 1 :] else 1
                break
            j += 1
        i += 1
    if i >= len(argv) or argv[i] == "-":
        raise ValueError(
            "the python command runs no script, -m module or -c code (an interactive or stdin "
            f"session cannot be guarded): {' '.join(argv)!r}"
        )
    return Program(argv, "script", argv[i], argv[i + 1 :])
