#!/usr/bin/env bash
# The tests: set up, then run the whole suite (real processes, real SB3 envs, real storages).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two test processes (pytest-xdist): most tests wait on real subprocesses, servers and monitors, so two
# share 2 cores well (17 min against 35 in one); MEMPRUNE_TEST_JOBS=0 runs them in this process.
# `bash scripts/test.sh --quick`: the edit-test loop, without the tests marked slow or over 2 s (tests/durations.json).
# The suite's calibration cache is its own (as in .ci/run), never the user's ~/.cache/optuna-memprune: tests
# measure and recheck stack baselines, some under the suite's own load.
export MEMPRUNE_CACHE_DIR="${MEMPRUNE_CACHE_DIR:-$PWD/.memprune-cache}"
# The project's own files byte-compiled once (a second run compiles only what changed, in well under a
# second): where PYTHONDONTWRITEBYTECODE is set, as on the CI machines, Python never writes them, and each of
# the suite's many subprocesses compiled the package from source again (0.35 s of CPU per process here).
.venv/bin/python -m compileall -q -j 0 optuna_memprune tests scripts studies >/dev/null
# --dist loadgroup: the tests of one xdist_group run in one process (the Ray tests share one cluster); the
# others are spread as by default.
exec .venv/bin/python -m pytest -q -n "${MEMPRUNE_TEST_JOBS:-2}" --dist loadgroup "$@"
