#!/usr/bin/env bash
# The core install alone, as a user without torch gets it: a fresh venv, `pip install .` (Optuna, numpy,
# psutil; no extras), the packages of the user's own programs (scikit-learn, LightGBM), then
# scripts/core_check.py with that venv's Python. Prints `CORE checks=<n> passed=<p> core_venv_mib=<m>`.
# Run: bash scripts/core_check.sh   (CI runs it beside the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
"$PY" -m venv "$root/venv"
"$root/venv/bin/python" -m pip install -q .
core_mib=$(du -sm "$root/venv" | cut -f1)  # the core install alone, pip and setuptools included
"$root/venv/bin/python" -m pip install -q scikit-learn lightgbm  # the user's programs' packages, not ours
CORE_VENV_MIB=$core_mib MEMPRUNE_CACHE_DIR="$root/cache" "$root/venv/bin/python" scripts/core_check.py
