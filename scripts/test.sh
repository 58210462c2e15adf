#!/usr/bin/env bash
# The test suite, in a virtual environment with the test extra. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh test
exec .venv/bin/python -m pytest "$@"
