"""A guarded study in the parent, and children that make their own in-memory studies: a multiprocessing child
(spawn, forkserver and fork) and a plain subprocess. Each child prints one JSON line: its sampler's class
name, and whether the hook's environment variable reached it."""

import json
import multiprocessing
import os
import subprocess
import sys

import optuna

CHILD = (
    "import json, os, optuna; s = optuna.create_study(); print(json.dumps({'how': 'subprocess', 'sampler': "
    "type(s.sampler).__name__, 'env': 'MEMPRUNE_RUN' in os.environ}), flush=True)"
)


def child(how: str) -> None:
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    print(
        json.dumps({"how": how, "sampler": type(study.sampler).__name__, "env": "MEMPRUNE_RUN" in os.environ}),
        flush=True,
    )


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    print(json.dumps({"how": "parent", "sampler": type(study.sampler).__name__}), flush=True)
    for how in ("spawn", "forkserver", "fork"):
        p = multiprocessing.get_context(how).Process(target=child, args=(how,))
        p.start()
        p.join()
        assert p.exitcode == 0, (how, p.exitcode)
    subprocess.run([sys.executable, "-c", CHILD], check=True)
