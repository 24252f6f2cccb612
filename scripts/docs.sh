#!/usr/bin/env bash
# Builds the documentation site (docs/ -> site/) with MkDocs, warnings as errors (mkdocs.yml: strict), the
# API reference generated from the docstrings (mkdocstrings). Uses .venv (scripts/setup.sh installs the
# docs extra). Run: bash scripts/docs.sh   (CI runs it; serve locally: .venv/bin/mkdocs serve)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --clean --site-dir "${SITE_DIR:-site}"
echo "DOCS site=${SITE_DIR:-site} pages=$(find "${SITE_DIR:-site}" -name index.html | wc -l)"
