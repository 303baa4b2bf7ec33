#!/usr/bin/env bash
# Set up and start the service on 127.0.0.1 (port: $PORT, default 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh service
export HF_HUB_OFFLINE=1
exec .venv/bin/uvicorn service.app:create_app --factory --host 127.0.0.1 --port "${PORT:-8000}"
