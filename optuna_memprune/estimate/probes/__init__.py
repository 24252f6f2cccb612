"""The calibration probes, modules each run in a fresh interpreter (``python -m ...probes.<name> SPEC``).

Owns their spec argument and their one PROBE line (after which the probe ends); imports atexit, json, os
and sys only, so a probe measures its stack.
"""

from __future__ import annotations

import atexit
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

    Nothing of the probe is left to do after its result: ``os._exit`` skips the interpreter's finalization,
    which tears down every imported module under repeated garbage collections (0.9 s of CPU for a process
    that imported torch, 1.4 s after a training step, of about 3 s in all: most of a calibration's probes).
    """
    print(MARK + json.dumps(result), flush=True)
    atexit._run_exitfuncs()  # what the libraries registered (multiprocessing ends its helpers) still runs
    sys.stderr.flush()
    os._exit(0)
