"""The compiled speculative round, read as a program: what a round holds and what it computes.

A round needs, per proposal, only the probability the drafter drew it with; a whole ``q`` row
only at a sampled rejection. So no round holds a ``[B, gamma, V]`` block (a draft model's
distributions, or a one-hot block for prompt lookup's), and a round in which every row is greedy
compares argmaxes: no exponential or logarithm over the vocabulary at all, where a sampled round
normalises the target's ``gamma + 1`` rows. These tests read the jaxpr of one round
(``programs.equations``), as ``test_sampling_structure`` does for a decode step.
"""

import numpy as np
import programs
import pytest
from flax import nnx

import decodelab as dl
from decodelab import sampling
from decodelab.decode.request import OutputSpec, RowInputs
from decodelab.speculative import generation as speculative
from decodelab.speculative.generation import ModelDrafter, NgramDrafter

B, GAMMA, S = 2, 3, 64  # V = 512 (the tiny config); no other dimension is 512


def round_equations(cfg, drafter_kind: str, params: dl.SamplingParams) -> list:
    V = cfg.vocab_size
    graphdef, target_weights = nnx.split(dl.Transformer(cfg, rngs=nnx.Rngs(0)))
    if drafter_kind == "prompt lookup":
        drafter, draft_weights = NgramDrafter(), None
    else:
        draft = dl.Transformer(cfg.replace(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                           d_ff=64), rngs=nnx.Rngs(1))
        draft_graphdef, draft_weights = nnx.split(draft)
        drafter = ModelDrafter(draft_graphdef)
    block, lengths = np.zeros((B, 16), np.int32), np.full((B,), 10, np.int32)
    caches = speculative.prefill(target_weights, draft_weights, block, lengths - 1,
                                 graphdef=graphdef, drafter=drafter, max_len=S)
    rows = RowInputs(prompt_lengths=lengths, keys=sampling.batch_keys(0, B),
                     params=params.per_row(B, V), eos_mask=np.zeros((V,), bool),
                     stop_ids=np.zeros((0, 1), np.int32))
    state = speculative.initial_state(*caches, block, rows, gamma=GAMMA, outputs=OutputSpec(16))
    return programs.equations(speculative.SPECULATIVE_LOOP.step,
                              (target_weights, draft_weights), state, graphdef=graphdef,
                              drafter=drafter)


def instructions(found: list[programs.Equation]) -> list[tuple[str, tuple[int, ...], str]]:
    """``(element type, dims, primitive)`` of every array an equation makes."""
    return [(str(t.dtype), t.shape, e.primitive) for e in found for t in e.output_types
            if hasattr(t, "shape")]


CASES = [(drafter, name) for drafter in ("draft model", "prompt lookup")
         for name in ("greedy", "sampled")]
PARAMS = {"greedy": dl.SamplingParams.greedy(), "sampled": dl.SamplingParams(temperature=0.8)}


@pytest.fixture(scope="module")
def rounds(tiny_config):
    return {(drafter, name): instructions(round_equations(tiny_config, drafter, PARAMS[name]))
            for drafter, name in CASES}


@pytest.mark.parametrize("drafter, name", CASES)
def test_no_round_holds_a_gamma_by_vocabulary_block(tiny_config, rounds, drafter, name):
    V = tiny_config.vocab_size
    blocks = [i for i in rounds[drafter, name] if i[1] in ((B, GAMMA, V), (B * GAMMA, V))]
    assert blocks == []


@pytest.mark.parametrize("drafter", ["draft model", "prompt lookup"])
def test_a_greedy_round_exponentiates_nothing_over_the_vocabulary(tiny_config, rounds, drafter):
    V = tiny_config.vocab_size
    over_vocabulary = lambda key: [  # noqa: E731
        i for i in rounds[key] if i[2] in ("exp", "log") and i[1][-1:] == (V,)]
    assert over_vocabulary((drafter, "greedy")) == []
    # The count sees a softmax where there is one: the sampled round normalises the target's
    # gamma + 1 rows.
    assert ("float32", (B, GAMMA + 1, V), "exp") in over_vocabulary((drafter, "sampled"))
