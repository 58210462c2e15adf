"""Experiments: config files with their sweeps, a resumable sharded runner, and result rows.

An experiment is a config file and a point function::

    configs/<name>.py      get_config(arg) -> ConfigDict with `experiment` (its name) and `seed`
                           get_sweep(arg)  -> list of override dicts (optional; none = one point)
    experiments/<name>.py  point_fn(config, ctx) -> {metric name: float | int | str | bool | None}

The runner applies each override dict (dotted keys, ``{"model.position": "alibi"}``) to the base
config (command-line overrides already in it), runs the points of its shard that have no row yet and
appends one row per finished point to ``<workdir>/rows.jsonl``. For example::

    # configs/lengths.py
    def get_config(arg=None):
        return ConfigDict(dict(experiment="lengths", seed=0, tokenizer=..., train=...,
                               model=presets.model_section(arg or "small"), eval=dict(length=128)))

    def get_sweep(arg=None):
        return product({"model.position": ["rope", "alibi"], "eval.length": [128, 256, 512]})

    # experiments/lengths.py
    _FLAGS = experiment.define_flags("configs/lengths.py")

    def evaluate(config, ctx):  # one point; the model is trained once and cached in the workdir
        model, tok = artefacts.trained_model(config.tokenizer, config.model, config.train,
                                             ctx.workdir, progress=ctx.show_progress)
        return metrics.perplexity(model, data.token_stream(tok, "validation"), config.eval.length)

    def main(argv):
        experiment.run_from_flags(_FLAGS, evaluate, argv)

    if __name__ == "__main__":
        experiment.run_program(main)  # a mistake prints one line (see experiment/cli.py)

Modules, one job each: ``sweep`` (product / zipped / cross, points, shards, ``get_sweep``),
``overrides`` (base config checks, config hash, dotted overrides), ``rows`` (the rows file and its
lock), ``provenance`` (git state, versions, machine, command), ``runner`` (``run``: the points that
have no row), ``program`` (absl flags and ``run_from_flags``) and ``cli`` (``run_program``, the
entry point of every program: a bad flag or a refused value as one line). Their public names are
re-exported here: ``from decodelab import experiment`` then ``experiment.run(...)``.

What a caller may rely on:

- A point is identified by its config hash: the first 16 hex digits of the sha256 of the resolved
  config as canonical JSON (sorted keys). The same resolved config always gets the same hash, however
  it was reached; two points of one sweep with the same hash are an error. Every field counts, even
  one that cannot change a result (an evaluation batch size): changing it makes new points.
- Shard ``i/n`` runs the points whose sweep index is ``i`` modulo ``n``: the shards of one sweep
  partition it (all shards must run the same config file, argument and overrides).
- ``rows.jsonl`` holds one JSON object per line and at most one row per config hash. Every write
  replaces the whole file (a temporary file in the same folder, fsync, ``os.replace``) while holding
  an ``flock`` on ``rows.jsonl.lock``: a reader sees the file before or after a row, never part of
  one, and processes sharing a workdir on one machine never lose each other's rows (shards on
  several machines write to their own workdirs and merge with ``merge_rows`` / ``add_rows``).
  Reading rejects a line that is not a row instead of skipping it, except a torn last line (a
  write cut short), skipped with a warning naming it so that its point runs again.
- A row also has ``other_cpu_s`` where ``/proc/stat`` is readable: the CPU seconds other processes
  took during the point (``cpu_seconds``), so a page can say whether its timings shared the machine.
- Re-running skips every point that has a row, so an interrupted sweep (Ctrl-C, a killed process)
  loses only the points in progress.
"""

from __future__ import annotations

# Base configs, hashes and overrides.
from decodelab.experiment.overrides import apply_overrides, check_base_config, config_hash
from decodelab.experiment.program import (ExperimentFlags, check_no_arguments,
                                          define_config_file, define_flags, run_from_flags)
from decodelab.experiment.cli import TRACEBACK_ENV, run_program

# Provenance.
from decodelab.experiment.provenance import PROVENANCE_FIELDS, cpu_seconds, git_state
from decodelab.report.pages import current_command

# The runner and the programs.
from decodelab.experiment.runner import (Metrics, PointContext, SweepOptions, check_one_sweep,
                                         run)

# Sweeps as data, points and shards.
from decodelab.experiment.sweep import (Point, cross, expand, load_sweep, parse_shard, product,
                                        shard, zipped)

# The compile counter lives with the code it measures in decodelab.measure.compiles; kept here for callers
# that count the compiles of a sweep.
from decodelab.measure.compiles import count_traces

# The rows file.
from decodelab.report.rows import (LOCK_FILE, ROW_FIELDS, ROWS_FILE, add_rows, check_writable,
                                   config_differences, json_dumps, merge_rows, read_rows,
                                   write_rows)
