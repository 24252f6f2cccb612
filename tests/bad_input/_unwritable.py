"""Real unwritable files and directories for the bad-input tests, also where the tests run as root.

``chmod`` alone stops no write by root (CAP_DAC_OVERRIDE). Where the tests run as root, the command under test
runs without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from its bounding set before exec), so the
kernel applies the file modes to it as to any user; ``check_unwritable`` skips with the reason where even that
cannot be done.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PR_CAPBSET_DROP = 24  # linux/prctl.h
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec only calls it


def without_dac_override() -> None:
    """``preexec_fn``: drop the capabilities that let root write where the file modes say no."""
    if os.geteuid() == 0:
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                os._exit(97)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``argv`` as a process that file modes bind."""
    return subprocess.run(argv, preexec_fn=without_dac_override, **{"capture_output": True, "text": True, **kwargs})


def check_unwritable(path: Path) -> None:
    """Skip (with the reason) unless a process started by ``run`` really cannot create a file in ``path``
    (a directory) or open ``path`` (a file) for writing."""
    target = path / "probe-write" if path.is_dir() else path
    proc = run([sys.executable, "-c", f"open({str(target)!r}, 'a')"])
    if proc.returncode == 0:
        pytest.skip(f"cannot make {path} unwritable here: this user writes whatever the file modes say")
