#!/usr/bin/env bash
# The main job: train a tokenizer and a small model on the bundled corpus, report validation
# perplexity and greedy continuations of held-out prompts. Extra arguments go to the experiment
# (e.g. --config.train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/python -m experiments.train --config=configs/train.py --workdir=runs/quickstart --resume "$@"
