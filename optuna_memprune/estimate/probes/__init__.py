"""The calibration probes, modules each run in a fresh interpreter (``python -m ...probes.<name> SPEC``).

Owns their spec argument and their one PROBE line (after which the probe ends); imports json, os and sys
only, so a probe measures its stack.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The prefix of the one line a probe prints: its result as JSON.
MARK = "PROBE"


def spec() -> dict[str, Any]:
    """The probe's spec: the JSON its runner passed as the first command-line argument."""
    args: dict[str, Any] = json.loads(sys.argv[1])
    return args


def emit(result: dict[str, Any]) -> None:
    """Print the probe's result, the one line its runner reads, and end the probe at once.

    A probe closes what it started (env workers) before its result, so nothing is left to do: ``os._exit``
    skips the interpreter's teardown of every imported module, 0.9 s of CPU in a probe that imported torch
    and 1.4 s after a training step (``memprune calibrate`` here: 51 s before, 39 s with it).
    """
    print(MARK + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)
