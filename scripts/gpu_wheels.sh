#!/usr/bin/env bash
# Downloads the wheels a bare GPU host lacks (scripts/_gpu/wheels.txt, pinned) for CPython 3.12 on
# manylinux x86_64 into an ignored folder (.gpu-wheels/, or $GPU_WHEELS_DIR), checks the set stays under
# the 64 MiB one call may carry, and prints the one command to run on the GPU host: install the carried
# wheels with --no-index into /tmp/site, then scripts/gpu_check.py with its output under $OUT.
# The project's own code travels as the working tree: it needs no wheel (PYTHONPATH=.:/tmp/site).
# Run: bash scripts/gpu_wheels.sh   (needs pip and the network to PyPI here, not there)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${GPU_WHEELS_DIR:-.gpu-wheels}"
python="${PYTHON:-python3}"
limit=$((64 * 1024 * 1024))
mkdir -p "$dest"
rm -f "$dest"/*.whl            # one version of each: two stop the whole install there
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dest" -r scripts/_gpu/wheels.txt
size=$(cat "$dest"/*.whl | wc -c)
count=$(ls "$dest"/*.whl | wc -l)
echo "wheels: $count in $dest, $size bytes ($((size / 1024 / 1024)) MiB; a call carries at most 64 MiB)"
if [ "$size" -gt "$limit" ]; then
    echo "error: the wheels take $size bytes, over the $limit a call may carry" >&2
    exit 1
fi
echo "carry: $dest"
echo "command: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade" \
     "--target /tmp/site $dest/*.whl && export PYTHONPATH=.:/tmp/site MEMPRUNE_CACHE_DIR=/tmp/memprune-cache" \
     "PYTHONUNBUFFERED=1 && python3 scripts/gpu_check.py --out \"\$OUT/gpu_check.json\" 2>&1 | tee \"\$OUT/gpu_check.log\""
