"""What the buffer tests share: the Atari observation shape and a fresh interpreter to measure RSS in."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ATARI_OBS = (4, 84, 84)  # VecFrameStack(4) + VecTransposeImage, as DQN's CnnPolicy stores it


def run_python(script: str, *args: str, timeout: float = 120) -> dict:
    """Run a script in a fresh interpreter (so RSS is its own) and return the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
