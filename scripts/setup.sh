#!/usr/bin/env bash
# Create .venv (once) and install the project (editable) with the given extras,
# at the versions of requirements/EXTRAS.lock where one exists (scripts/lock.sh
# writes them; `worker` has ranges and no lock).  It installs only when
# pyproject.toml or that lock changed since its last install of these extras:
# a stamp in .venv holds their hash.
# Usage: scripts/setup.sh EXTRAS   e.g. scripts/setup.sh service   or   scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:?usage: scripts/setup.sh EXTRAS}"
for extra in ${extras//,/ }; do
    grep -q "^${extra} = \[" pyproject.toml || { echo "no extra '$extra' in pyproject.toml" >&2; exit 2; }
done
lock="requirements/${extras}.lock"
inputs=(pyproject.toml)
constraints=()
if [[ -f "$lock" ]]; then inputs+=("$lock"); constraints=(-c "$lock"); fi
stamp=".venv/.setup-${extras}.sha256"
hash="$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"
if [[ -x .venv/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
    exit 0  # installed from these very files
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${constraints[@]}" \
    -e ".[${extras}]"
echo "$hash" >"$stamp"
