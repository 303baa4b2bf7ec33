#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml with pip-tools' pip-compile:
#   requirements/service.lock  what `scripts/setup.sh service`, serve.sh and the Dockerfile install
#   requirements/test.lock     what `scripts/setup.sh test` (CI) installs
# Run after changing a dependency in pyproject.toml, then commit both files.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .cache/lock-venv
.cache/lock-venv/bin/python -m pip install --quiet --disable-pip-version-check "pip-tools==7.7.0"
for extra in service test; do
    .cache/lock-venv/bin/pip-compile --quiet --strip-extras --no-emit-index-url \
        --no-emit-find-links --extra "$extra" --output-file "requirements/$extra.lock" pyproject.toml
    # The project itself (pulled in by its self-referencing extras) is installed
    # from the checkout, not constrained: drop its line, a path on this machine.
    sed -i '/^ckpt-advisor @ /d' "requirements/$extra.lock"
done
