"""The compiled speculative round, read as a program: what a round holds and what it computes.

A round needs, per proposal, only the probability the drafter drew it with; a whole ``q`` row
only at a sampled rejection. So no round holds a ``[B, gamma, V]`` block (a draft model's
distributions, or a one-hot block for prompt lookup's). A round is one program for greedy and
sampled rows: when every row is greedy it takes the branches that compare argmaxes (branch 1 of
each choice), which exponentiate nothing over the vocabulary, where the sampled branch
normalises the target's ``gamma + 1`` rows; nothing outside those choices does either. These
tests read the jaxpr of one round (``programs.equations``), as ``test_sampling_structure`` does
for a decode step.
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


def instructions(found: list[programs.Equation], where=lambda branches: True
                 ) -> list[tuple[str, tuple[int, ...], str]]:
    """``(element type, dims, primitive)`` of every array made by an equation whose enclosing
    cond branches satisfy ``where``."""
    return [(str(t.dtype), t.shape, e.primitive) for e in found if where(e.branches)
            for t in e.output_types if hasattr(t, "shape")]


CASES = [(drafter, name) for drafter in ("draft model", "prompt lookup")
         for name in ("greedy", "sampled")]
PARAMS = {"greedy": dl.SamplingParams.greedy(), "sampled": dl.SamplingParams(temperature=0.8)}


@pytest.fixture(scope="module")
def rounds(tiny_config):
    return {(drafter, name): round_equations(tiny_config, drafter, PARAMS[name])
            for drafter, name in CASES}


@pytest.mark.parametrize("drafter, name", CASES)
def test_no_round_holds_a_gamma_by_vocabulary_block(tiny_config, rounds, drafter, name):
    V = tiny_config.vocab_size
    blocks = [i for i in instructions(rounds[drafter, name])
              if i[1] in ((B, GAMMA, V), (B * GAMMA, V))]
    assert blocks == []


@pytest.mark.parametrize("drafter", ["draft model", "prompt lookup"])
def test_a_greedy_round_exponentiates_nothing_over_the_vocabulary(tiny_config, rounds, drafter):
    """The round is the same program under greedy and sampled parameters. Its exponentials and
    logarithms over the vocabulary all sit in branch 0 (the sampled one) of a choice between
    sampled and greedy (a cond outside every other cond); none is outside the choices or in
    their greedy branches."""
    V = tiny_config.vocab_size
    greedy, sampled = rounds[drafter, "greedy"], rounds[drafter, "sampled"]
    assert [e.primitive for e in greedy] == [e.primitive for e in sampled]

    def over_vocabulary(where):
        return [i for i in instructions(greedy, where)
                if i[2] in ("exp", "log") and i[1][-1:] == (V,)]

    assert over_vocabulary(lambda branches: not branches or branches[0][1] == 1) == []
    # The count sees a softmax where there is one: the sampled branch normalises the target's
    # gamma + 1 rows.
    assert ("float32", (B, GAMMA + 1, V), "exp") in over_vocabulary(
        lambda branches: bool(branches) and branches[0][1] == 0)
