#!/usr/bin/env bash
# Sets up everything on a fresh machine with only Python 3.10+ present: a virtualenv in .venv with the
# CPU build of torch (pinned: a looser requirement pulls a multi-GB CUDA build), the package with all its
# extras, the test tools and the docs tools. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.memprune-setup
want="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
# Byte-compiled once, on every core: pip compiles each package's files on one core (149 s of a 2-core fresh
# set-up against 65 s without), and where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) nothing is
# compiled later. Tried: no compile here, the suite writing byte-code as it imports: the recheck tests failed
# (a stack measured by the suite's first probes, which compiled it, came out 16-18 MB above its recheck, over
# the 13 MB tolerance). What torch brought is compiled on one core while pip installs the rest on the other;
# the packages' own tests are left out (-x: 3,092 of 15,635 files, pandas' and sympy's mostly: 63 s -> 42 s).
# The files it cannot compile are the ones pip skips too (torch ships test helpers in Python 3.12 syntax).
compile=(.venv/bin/python -m compileall -q -q -x '/tests?/')  # -q -q: not even the files it cannot compile
.venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
purelib="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
mapfile -t first < <(find "$purelib" -mindepth 1 -maxdepth 1 -type d)
"${compile[@]}" "${first[@]}" &
compiling=$!
.venv/bin/python -m pip install -q --no-compile -e ".[all,test,docs]"
wait "$compiling" || true
"${compile[@]}" -j 0 "$purelib" || true
echo "$want" > "$stamp"
