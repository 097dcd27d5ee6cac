#!/usr/bin/env bash
# Install from nothing, lint, and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
python -m pytest -q -n 2 --dist worksteal "$@"  # two workers (CI has 2 cores); an idle one takes the other's queued tests
