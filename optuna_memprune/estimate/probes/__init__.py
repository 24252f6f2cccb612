"""The calibration probes, modules each run in a fresh interpreter (``python -m ...probes.<name> SPEC``).

Owns their spec argument and their one PROBE line; imports json and sys only, so a probe measures its stack.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: The prefix of the one line a probe prints: its result as JSON.
MARK = "PROBE"


def spec() -> dict[str, Any]:
    """The probe's spec: the JSON its runner passed as the first command-line argument."""
    args: dict[str, Any] = json.loads(sys.argv[1])
    return args


def emit(result: dict[str, Any]) -> None:
    """Print the probe's result, the one line its runner reads."""
    print(MARK + json.dumps(result))
