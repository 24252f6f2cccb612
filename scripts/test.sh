#!/usr/bin/env bash
# The tests: set up, then run the whole suite (real processes, real SB3 envs, real storages).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
