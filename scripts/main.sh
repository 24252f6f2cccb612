#!/usr/bin/env bash
# The main job: set up, then run the guarded demo study on the embedded default (SQLite file, no server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python studies/demo.py "$@"
