"""Runs one of the client programs for a single trial with given params, unchanged: ``optuna.create_study``
is wrapped so the study the program (or its library) makes has the assignment enqueued, and the program then
runs as ``__main__`` with ``N_TRIALS=1``. The bench measures the process's peak from outside.

The study is kept on a SQLite file of its own (``OPTUNA_STORAGE``, removed at exit), as the bench's runs keep
theirs: Optuna's RDB storage (SQLAlchemy, its ORM) holds about 30 MiB of a program's process, which a replay
in memory left out (Lightning's draws peaked at 448-455 MiB so; its guarded run's process stood at 468 MiB
before its first trial).

Usage: ``python _replay.py PROGRAM.py '{"param": value, ...}' [OUT.json]``; ``{}`` runs the program's own first
draw (its sampler seeded by ``SEED``); with ``OUT.json``, the params that ran are written there at exit.
"""

import atexit
import json
import os
import runpy
import shutil
import sys
import tempfile

import optuna

program, params = sys.argv[1], json.loads(sys.argv[2])
out = sys.argv[3] if len(sys.argv) > 3 else None
os.environ.update(N_TRIALS="1", N_JOBS="1")
_db = os.path.join(tempfile.mkdtemp(prefix="replay-"), "study.db")
os.environ["OPTUNA_STORAGE"] = f"sqlite:///{_db}"
atexit.register(lambda: shutil.rmtree(os.path.dirname(_db), ignore_errors=True))
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
