"""Runs one of the client programs for a single trial with given params, unchanged: ``optuna.create_study``
is wrapped so the study the program (or its library) makes has the assignment enqueued, and the program then
runs as ``__main__`` with ``N_TRIALS=1``. The bench measures the process's peak from outside.

Usage: ``python _replay.py PROGRAM.py '{"param": value, ...}' [OUT.json]``; ``{}`` runs the program's own first
draw (its sampler seeded by ``SEED``); with ``OUT.json``, the params that ran are written there at exit.
"""

import atexit
import json
import os
import runpy
import sys

import optuna

program, params = sys.argv[1], json.loads(sys.argv[2])
out = sys.argv[3] if len(sys.argv) > 3 else None
os.environ.update(N_TRIALS="1", N_JOBS="1")
os.environ.pop("OPTUNA_STORAGE", None)
_create_study = optuna.create_study


def create_study(*args, **kwargs):
    study = _create_study(*args, **kwargs)
    if params:
        study.enqueue_trial(params)
    if out is not None:
        atexit.register(lambda: open(out, "w").write(json.dumps(study.trials[0].params if study.trials else None)))
    return study


optuna.create_study = create_study
sys.argv = [program]
sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
runpy.run_path(program, run_name="__main__")
