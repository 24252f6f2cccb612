"""Helpers of ``scripts/probe_bad_input.py``: what a case is and how it is run and judged (``harness``), the
objectives, footprints and guards the cases use (``objectives``), the process that runs one case
(``child``) and the multi-step fault scenarios (``faults``).

Nothing here is part of the package; every module is importable from ``scripts/`` (the probe puts it on
PYTHONPATH), so the trial processes and ``memprune worker module:name`` can load the objectives.
"""
