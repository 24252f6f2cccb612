"""The calibration probes: modules each run in a fresh interpreter (``python -m ...probes.<name> SPEC``).

Owns what every probe shares: its spec (JSON, the first argument) and its one ``PROBE`` output line; a probe
imports json, sys and procfs of the package only, so what it measures is the stack it was asked about.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: The prefix of the one line a probe prints: its result as JSON.
MARK = "PROBE"


def spec() -> dict[str, Any]:
    """The probe's spec: the JSON its runner passed as the first command-line argument."""
    return json.loads(sys.argv[1])


def emit(result: dict[str, Any]) -> None:
    """Print the probe's result, the one line its runner reads."""
    print(MARK + json.dumps(result))
