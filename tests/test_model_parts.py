"""model.split: the compiled programs find themselves by a GraphDef hashed once per split, not
once per program call (each hash walks the whole node list)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from flax.nnx import graphlib

import decodelab as dl
from decodelab import model as models
from decodelab.model import Transformer
from decodelab.serving import Request, SlotEngine


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture
def hashes(monkeypatch):
    """How many times an nnx GraphDef's node list is hashed."""
    count = [0]
    plain = graphlib.GraphDef.__hash__

    def counted(self):
        count[0] += 1
        return plain(self)

    monkeypatch.setattr(graphlib.GraphDef, "__hash__", counted)
    return count


def test_the_split_graphdef_hashes_and_merges_like_nnx_split(tiny):
    graphdef, weights = models.split(tiny)
    plain, plain_weights = nnx.split(tiny)
    assert isinstance(graphdef, graphlib.GraphDef) and hash(graphdef) == hash(plain)
    assert graphdef == models.split(tiny)[0]  # equal structures are equal keys
    tokens = np.arange(6, dtype=np.int32).reshape(1, 6) % tiny.config.vocab_size
    merged = jax.jit(lambda w, t, *, g: nnx.merge(g, w)(t), static_argnames="g")
    np.testing.assert_array_equal(np.asarray(merged(weights, tokens, g=graphdef)),
                                  np.asarray(merged(plain_weights, tokens, g=plain)))


def test_a_generate_call_hashes_the_node_list_once_and_an_engine_step_never(tiny, hashes):
    prompts, greedy = [[1, 2, 3], [4, 5]], dl.SamplingParams(temperature=0.0)
    dl.generate(tiny, prompts, greedy, max_new_tokens=4)  # compiles
    hashes[0] = 0
    dl.generate(tiny, prompts, greedy, max_new_tokens=4)
    assert hashes[0] == 1  # the split's; its new cache, prefill and decode loop: none
    engine = SlotEngine(tiny, 2, 16)
    request = Request(id=0, prompt=[1, 2, 3], max_new_tokens=6, params=greedy)
    engine.insert(request)
    engine.step(1)  # compiles
    hashes[0] = 0
    while engine.active:
        engine.step(1)
    assert hashes[0] == 0
