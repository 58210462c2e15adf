"""Pruning: weights zeroed (magnitude, Wanda; unstructured and N:M) and heads / hidden units
removed, with and without recovery fine-tuning, judged by KL divergence to the float32 model
(the quantization study's scoreboard) and by decode speed.

    python -m experiments.pruning --config=configs/pruning.py --workdir=runs/pruning
    python -m experiments.report --workdir=runs/pruning --out=results

One point = one candidate: what is removed (``kind``), how (``method`` / ``importance``), how
much (``sparsity`` / ``fraction``), the recovery steps, and the weights' format after pruning
(``decodelab.experiment.compression.pruned``). Its metrics:

- the scoreboard (``dl.compare``: ``kl_mean``, ``kl_p99``, ``same_top``, ``rms_top_prob``,
  perplexities, ``*_per_window``) of the candidate against the float32 reference on
  ``num_windows`` windows of ``window_tokens + 1`` test-play tokens; ``parameter_bytes`` at each
  element's width;
- ``sparsity``, ``params``, ``recovery_loss``, ``heads_kept``, ``head_importance``: what the
  candidate is (``experiment.compression``'s docstring);
- ``tokens_per_s_b<B>``, ``reference_reps_s_b<B>``, ``reps_s_b<B>``, ``speedup_b<B>``: greedy
  decoding against the reference, runs interleaved (``decodelab.measure.compression``);
- ``load_1min``: the machine's 1-minute load average when the point started.
"""

from __future__ import annotations

import os


import decodelab as dl
from decodelab import experiment, report
from decodelab.experiment import compression as candidates
from decodelab.measure.compression import time_decoding
from decodelab.text.data import token_windows
from decodelab.report import compression
from decodelab.report import pruning_tables as tables
from decodelab.report.compression import Target, kl_minus, speed

_FLAGS = experiment.define_flags("configs/pruning.py")


def evaluate(config, ctx) -> dict:
    """One point: the metrics of the module docstring."""
    load = os.getloadavg()[0]
    candidates.check_pruning(config)
    model, tokenizer = candidates.reference_model(config, ctx)
    calibration = token_windows(tokenizer, "train", config.calibration_windows,
                                config.window_tokens)
    ctx.status("prune")
    candidate, extra = candidates.swap_candidate(candidates.pruning_key(config), lambda: (
        candidates.pruned(config, model, tokenizer, calibration, ctx)))
    ctx.status("scoreboard")
    windows = token_windows(tokenizer, "test", config.num_windows, config.window_tokens + 1)
    board = dl.compare(model, candidate, windows)
    row = {"label": candidates.pruning_label(config), "load_1min": load, **board.as_dict(),
           **extra, "parameter_bytes": board.parameter_bytes_candidate}
    prompts = token_windows(tokenizer, "test", max(config.batch_sizes),
                            config.prompt_tokens).tolist()
    row.update(time_decoding(model, candidate, prompts, config.batch_sizes, config.new_tokens,
                             config.repeats, status=ctx.status))
    return row


# The targets, as data: what is measured on which rows, the threshold and the comparison.
TARGETS = (
    Target("25% of hidden units removed", "speed-up at batch 1", speed(1, tables.NEURONS_25),
           1.15, units="timed runs", unit="x"),
    Target("25% of hidden units removed", "its weight-bytes ceiling (dense bytes / its bytes)",
           tables.weight_bytes_ceiling, 1.15, units="", unit="x"),
    Target("requested sparsity", "largest miss over the unstructured and N:M rows",
           tables.largest_sparsity_miss, 0.001, at_least=False, units=""),
    Target("the study's points", "minutes in all", tables.wall_minutes, 90.0, at_least=False,
           units=""),
    *[Target("Wanda minus magnitude, mean KLD (no recovery)", name,
             kl_minus(tables.pruned(kind, "wanda", sparsity),
                      tables.pruned(kind, "magnitude", sparsity)), 0.0, at_least=False)
      for name, kind, sparsity in tables.PATTERNS],
)


def recovery_targets(rows) -> list[Target]:
    """Per recovered row with a twin: recovery lowers the mean KLD (paired over the windows)."""
    return [Target("recovered minus not recovered, mean KLD", compression.metric(twin, "label"),
                   kl_minus(tables.where_of(recovered), tables.where_of(twin)), 0.0,
                   at_least=False, pages="trained")
            for recovered, twin in tables.recovery_pairs(rows)]


def forms(rows) -> list[report.Form]:
    """One page per reference model: ``pruning`` (trained) or ``pruning_<model>``."""
    return compression.model_forms(
        "pruning", rows, lambda group: [*TARGETS, *recovery_targets(group)], tables,
        tables.csv_tables, "mean KL divergence and perplexity against unstructured sparsity")


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
