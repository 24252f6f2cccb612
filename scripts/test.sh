#!/usr/bin/env bash
# The tests: set up, then run the whole suite (real processes, real SB3 envs, real storages). With no
# arguments, two at a time (pytest-xdist, a file per worker) except the tests marked `serial`
# (tests/conftest.py: they measure the host or race the clock), which then run alone; with arguments,
# pytest as given (`bash scripts/test.sh tests/guard -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
status=0
.venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not serial" || status=$?
.venv/bin/python -m pytest -q -m serial || status=$((status ? status : $?))
exit "$status"
