#!/usr/bin/env bash
# The test suite, in a virtual environment with the test extra. Extra arguments go to pytest.
# pytest-xdist runs the test files on up to 2 worker processes (one per core where there are
# fewer): most tests are dominated by single-threaded XLA compilation, which one process leaves
# to one core. Each file stays on one worker, so its module-scoped fixtures (compiled programs,
# loaded checkpoints) are built once. `-n 0` after this script's name runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh test
exec .venv/bin/python -m pytest --numprocesses=auto --maxprocesses=2 --dist=loadfile "$@"
