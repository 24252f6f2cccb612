#!/usr/bin/env bash
# The main job: set up, then run the demo on the embedded default (SQLite file, no server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -f studies/demo.py ]; then
  exec .venv/bin/python studies/demo.py "$@"
fi
exec .venv/bin/memprune predict sb3 --algo dqn --env ALE/Pong-v5 --frame-stack 4 buffer_size=100000 batch_size=32
