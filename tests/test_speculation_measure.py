"""measure.speculation end to end on tiny models: one point's row from a real draft model and from
prompt lookup (the pages' tests build rows by hand; this runs the point function's timing and
cost paths, which call the library's decoding APIs)."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from decodelab import speculative
from decodelab.measure import speculation as measure
from decodelab.model import Transformer


@pytest.fixture(scope="module")
def models(tiny_config):
    return (Transformer(tiny_config, rngs=nnx.Rngs(0)),
            Transformer(tiny_config.replace(n_layers=1), rngs=nnx.Rngs(1)))


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_point_row_holds_its_counts_costs_and_paired_timings(models, drafter):
    target, draft = models
    proposer = draft if drafter == "model" else speculative.NgramDrafter(max_ngram=2)
    prompts = np.random.default_rng(0).integers(0, target.config.vocab_size, (2, 6)).tolist()
    run = measure.Run(gamma=2, temperature=0.7, batch_size=1, new_tokens=6, seed=0, max_len=16,
                      repeats=2, step_tokens=4)
    row = measure.measure_point(target, proposer, prompts, run, name=drafter, load_1min=0.0,
                                status=lambda text: None)
    assert row["c"] > 0 and row["verify_cost"] > 0 and row["target_step_ms"] > 0
    assert row["tokens_per_call"] >= 1.0 and 0.0 <= (row["alpha"] or 0.0) <= 1.0
    assert row["speedup"] > 0 and row["drafter"] == drafter
    # Two repetitions of each of the two one-prompt batches, paired.
    assert len(row["target_seconds_per_batch"]) == len(row["speculative_seconds_per_batch"]) == 2
    assert sum(row["generated_per_prompt"]) == 2 * 6
