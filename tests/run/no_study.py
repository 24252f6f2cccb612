"""A program that never creates an Optuna study: prints a line and exits 4."""

import sys

print("no study here")
sys.exit(4)
