#!/usr/bin/env bash
# Create .venv (once) and install decodelab into it with the extras given as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
extras=$(IFS=,; echo "$*")
.venv/bin/python -m pip install --quiet --editable ".${extras:+[$extras]}"
