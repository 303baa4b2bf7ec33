#!/usr/bin/env bash
# Set up and start the service on 127.0.0.1:8000 (settings: CKPT_* environment
# variables, e.g. CKPT_PORT; see docs/service.md).  The packages are the exact
# versions of requirements/service.lock, installed by scripts/setup.sh only
# when pyproject.toml or the lock changed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh service
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m service
