"""QuantizedKVCache: keys and values stored as int8 / int4 with per-token scales, read back within
half a scale, behind KVCache's interface; the kv_cache option of generate, speculative decoding and
the serving engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab import kvquant
from decodelab.serving import Request, SlotEngine
from tests.conftest import TINY

GREEDY = dl.SamplingParams.greedy()
PROMPTS = [[5, 9, 13], [7, 1, 2, 3, 4, 8]]


@pytest.fixture(scope="module")
def cfg():
    return dl.ModelConfig(position="rope", **TINY)  # L 2, K 2, H 16


@pytest.fixture(scope="module")
def model(cfg):
    return dl.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("kind, qmax", [("int8", 127), ("int4", 7)])
def test_each_stored_element_is_within_half_its_tokens_scale(cfg, kind, qmax):
    k = 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 2, 16))  # [B, T, K, H]
    v = jax.random.normal(jax.random.key(1), (2, 5, 2, 16))
    cache = kvquant.QuantizedKVCache.init(cfg, 2, 8, kind)
    cache = cache.write(1, k, v).advance(jnp.asarray([5, 5]))
    read_k, read_v = cache.read(1, 0, 5)  # [B, K, T, H]
    for written, read in ((k, read_k), (v, read_v)):
        written = np.asarray(written).swapaxes(1, 2)  # [B, K, T, H]
        scale = np.abs(written).max(axis=-1, keepdims=True) / qmax  # one per token and kv head
        assert (np.abs(np.asarray(read) - written) <= scale / 2 * (1 + 1e-6)).all()
    assert cache.values.k.dtype == kvquant.KINDS[kind][0]


@pytest.mark.parametrize("kind, stored, per_token", [(None, 16384, 512), ("int8", 5120, 160),
                                                     ("int4", 3072, 96)])
def test_cache_bytes_shrink(cfg, kind, stored, per_token):
    # B 2, S 16: 2 (k, v) x L 2 x B 2 x K 2 x S 16 = 256 vectors of H 16, each with one float32
    # scale when quantized: float32 64 bytes, int8 16 + 4, int4 8 + 4.
    cache = kvquant.init_cache(cfg, 2, 16, kind)
    nbytes = cache.k.nbytes + cache.v.nbytes if kind is None else cache.nbytes()
    assert nbytes == stored
    assert kvquant.bytes_per_token(cfg, kind) == per_token


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_cache_prefill_then_steps_matches_one_prefill(cfg, model, kind):
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, TINY["vocab_size"], jnp.int32)
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, cache):
        return nnx.merge(graphdef, state)(tokens, cache=cache)

    whole, _ = run(state, tokens, kvquant.init_cache(cfg, 2, 12, kind))
    logits, cache = run(state, tokens[:, :8], kvquant.init_cache(cfg, 2, 12, kind))
    steps = [logits]
    for t in range(8, 12):
        logits, cache = run(state, tokens[:, t:t + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), whole, atol=1e-5, rtol=1e-5)
    float_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    assert float(jnp.abs(whole - float_logits).max()) > 0  # the cache's rounding reaches the logits


def test_greedy_speculative_with_an_int8_cache_equals_greedy_generate_with_one(model):
    draft = dl.quantize(model, weights="int4", group_size=32)
    expected = dl.generate(model, PROMPTS, GREEDY, 8, seed=0, kv_cache="int8").token_lists()
    spec = dl.speculative_generate(model, draft, PROMPTS, GREEDY, gamma=3, max_new_tokens=8,
                                   seed=0, kv_cache="int8")
    assert spec.token_lists() == expected


def test_engine_with_an_int8_cache_generates_what_generate_does(model):
    expected = dl.generate(model, PROMPTS, GREEDY, 6, seed=0, kv_cache="int8").token_lists()
    engine = SlotEngine(model, num_slots=2, max_len=32, kv_cache="int8")
    done = engine.run([Request(id=i, prompt=p, max_new_tokens=6) for i, p in enumerate(PROMPTS)])
    assert [done[i].tokens for i in range(len(PROMPTS))] == expected


@pytest.mark.parametrize("call", [
    lambda m: dl.generate(m, PROMPTS, GREEDY, 4, kv_cache="fp8"),
    lambda m: dl.speculative_generate(m, m, PROMPTS, GREEDY, 2, 4, kv_cache="fp8"),
    lambda m: SlotEngine(m, num_slots=2, max_len=32, kv_cache="fp8"),
])
def test_unknown_kv_cache_kind_is_rejected_naming_the_argument(model, call):
    with pytest.raises(ValueError, match=r"kv_cache must be None \(float\) or one of "
                                         r"\('int8', 'int4'\), got 'fp8'"):
        call(model)
