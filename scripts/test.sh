#!/usr/bin/env bash
# Set up and run the whole test suite: lint, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
export HF_HUB_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # architecture contracts: .importlinter
.venv/bin/python -m pytest "$@"
