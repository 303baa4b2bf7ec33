#!/usr/bin/env bash
# Create .venv (once) and install the project with the given extras, at the
# versions of requirements/EXTRAS.lock (regenerate with scripts/lock.sh).
# Usage: scripts/setup.sh EXTRAS   e.g. scripts/setup.sh service   or   scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:?usage: scripts/setup.sh EXTRAS}"
python3 -m venv .venv
# torch==2.13.0 is pinned in pyproject: pip takes the CPU wheel from the local
# wheel store where one is configured, instead of a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
lock="requirements/${extras}.lock"
[[ -f "$lock" ]] || { echo "no lock file $lock (scripts/lock.sh writes it)" >&2; exit 2; }
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c "$lock" -e ".[${extras}]"
