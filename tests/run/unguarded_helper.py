"""A script with no ``if __name__ == "__main__":`` whose study is made and run inside a function of an imported
module (``search_helper.search``), so that no reading of its text finds it: ``python unguarded_helper.py MARKS
STATUS``. Its top level and each call of its objective append a line to MARKS; it prints its trials and exits
with STATUS."""

import sys

import numpy as np

import search_helper

MARKS = sys.argv[1]
search_helper.mark(MARKS, "top level")


def objective(trial):
    rows = trial.suggest_int("rows", 10_000, 200_000, log=True)
    search_helper.mark(MARKS, f"trial {trial.number}")
    return float(np.ones((rows, 8), dtype=np.float32).sum())


study = search_helper.search(objective, n_trials=6, n_jobs=2)
search_helper.report(study)
sys.exit(int(sys.argv[2]))
