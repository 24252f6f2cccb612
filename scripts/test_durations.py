"""Writes tests/durations.json (each test's seconds in a full run) from pytest's JUnit XML, for the quick tier
(``scripts/test.sh --quick`` leaves out the tests over 2 s; tests/conftest.py).

Run after a full run: ``bash scripts/test.sh --junitxml=/tmp/junit.xml && python scripts/test_durations.py
/tmp/junit.xml``. Prints ``DURATIONS tests=<n> total_s=<x> quick=<k> quick_s=<x>``.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
QUICK_MAX_S = 2.0


def plain_nodeid(nodeid: str) -> str:
    """A node id without the ``@group`` pytest-xdist's ``--dist loadgroup`` appends to a grouped test's
    (the same rule as xdist's: an ``@`` after the last ``]``), as durations.json keeps it and
    tests/conftest.py looks it up."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def nodeid(case: ET.Element) -> str:
    """pytest's node id of a JUnit test case (``classname`` is the dotted path, then the class if any),
    without a group suffix (:func:`plain_nodeid`)."""
    parts = case.get("classname", "").split(".")
    name = plain_nodeid(case.get("name", ""))
    for i in range(len(parts), 0, -1):  # the longest prefix that is a test file
        path = Path(*parts[:i]).with_suffix(".py")
        if (OUT.parent.parent / path).exists():
            return "::".join([path.as_posix(), *parts[i:], name])
    return name


def main(xml: str) -> int:
    took: dict[str, float] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        node = nodeid(case)
        took[node] = round(took.get(node, 0.0) + float(case.get("time", 0.0)), 3)
    OUT.write_text(json.dumps(dict(sorted(took.items())), indent=0) + "\n")
    quick = [t for t in took.values() if t <= QUICK_MAX_S]
    print(f"DURATIONS tests={len(took)} total_s={sum(took.values()):.0f} quick={len(quick)} quick_s={sum(quick):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
