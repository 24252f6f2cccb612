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
# Not byte-compiled here: pip compiles every file of every package on one core (149 s of a 2-core fresh
# set-up against 65 s without), most of them never imported; Python writes the .pyc of each module the first
# time it imports it (unless PYTHONDONTWRITEBYTECODE is set: scripts/test.sh unsets it for the suite).
.venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
.venv/bin/python -m pip install -q --no-compile -e ".[all,test,docs]"
echo "$want" > "$stamp"
