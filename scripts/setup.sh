#!/usr/bin/env bash
# Create .venv (once) and install the project with the given extras.
# Usage: scripts/setup.sh EXTRAS   e.g. scripts/setup.sh service   or   scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:?usage: scripts/setup.sh EXTRAS}"
python3 -m venv .venv
# torch==2.13.0 is pinned in pyproject: pip takes the CPU wheel from the local
# wheel store where one is configured, instead of a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
