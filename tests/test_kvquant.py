"""Quantized KV caches: int8 (a scale per token and kv head) and int4 in KIVI's layout (keys per
channel over groups of slots, values per token, the newest slots in float), read back within half
a scale behind KVCache's interface; logits that do not depend on how tokens were split into
blocks; the kv_cache option of generate, speculative decoding and the serving engine."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import TINY

import decodelab as dl
from decodelab import cache as kvcache
from decodelab.model import attention
from decodelab.serving import EngineOptions, Request, SlotEngine

GREEDY = dl.SamplingParams.greedy()
PROMPTS = [[5, 9, 13], [7, 1, 2, 3, 4, 8]]
SMALL = kvcache.Kivi(group_size=8, residual=3, max_rewind=6)  # W = 3 + 7 + 6 = 16 float slots
TINY_GROUPS = kvcache.Kivi(group_size=4, max_rewind=8)  # groups fill within a short generation


@pytest.fixture(scope="module")
def cfg():
    return dl.ModelConfig(position="rope", **TINY)  # L 2, K 2, H 16


@pytest.fixture(scope="module")
def model(cfg):
    return dl.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def run(model):
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames="blocking")
    def call(tokens, cache, num_valid=None, blocking=attention.BLOCKING):
        return nnx.merge(graphdef, state)(tokens, cache=cache, num_valid=num_valid,
                                          blocking=blocking)

    return call


def test_int8_elements_are_within_half_their_tokens_scale(cfg):
    k = 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 2, 16))  # [B, T, K, H]
    v = jax.random.normal(jax.random.key(1), (2, 5, 2, 16))
    cache = _store(kvcache.QuantizedKVCache.init(cfg, 2, 8, "int8"), k, v)
    read_k, read_v = cache.read(0, 0, 5)  # [B, K, T, H]
    for written, read in ((k, read_k), (v, read_v)):
        written = np.asarray(written).swapaxes(1, 2)  # [B, K, T, H]
        scale = np.abs(written).max(axis=-1, keepdims=True) / 127  # one per token and kv head
        assert (np.abs(np.asarray(read) - written) <= scale / 2 * (1 + 1e-6)).all()
    assert cache.values.k.dtype == jnp.int8


@jax.jit
def _store(cache, k, v):
    """``cache`` after writing ``k, v: [B, T, K, H]`` to layer 0, every token valid."""
    return cache.write(0, k, v).advance(jnp.full((k.shape[0],), k.shape[1], jnp.int32))


def _written(T):
    k = 3.0 * jax.random.normal(jax.random.key(0), (2, T, 2, 16))  # [B, T, K, H]
    k = k.at[..., 3].multiply(20.0)  # an outlier channel, as real keys have
    v = jax.random.normal(jax.random.key(1), (2, T, 2, 16))
    return k, v


def test_int4_keys_are_within_half_their_channel_groups_scale_and_values_their_tokens(cfg):
    k, v = _written(40)
    cache = _store(kvcache.KiviKVCache.init(cfg, 2, 48, SMALL), k, v)
    read_k, read_v = cache.read_stored(0, 0, 40)  # five complete groups of 8 slots
    keys = np.asarray(k).swapaxes(1, 2).reshape(2, 2, 5, 8, 16)  # [B, K, groups, G, H]
    key_scale = (keys.max(axis=3, keepdims=True) - keys.min(axis=3, keepdims=True)) / 15
    key_error = np.abs(np.asarray(read_k).reshape(keys.shape) - keys)
    assert (key_error <= key_scale / 2 * (1 + 1e-5)).all()
    values = np.asarray(v).swapaxes(1, 2)  # [B, K, T, H]: one group of all 16 channels
    value_scale = (values.max(axis=-1, keepdims=True) - values.min(axis=-1, keepdims=True)) / 15
    assert (np.abs(np.asarray(read_v) - values) <= value_scale / 2 * (1 + 1e-5)).all()
    assert cache.k.dtype == cache.v.dtype == jnp.uint4


def test_int4_newest_slots_read_exactly_in_float_and_older_ones_quantized(cfg):
    # length 40, R 3, G 8: the newest query reads slots below 8 * floor((40 - 3) / 8) = 32
    # dequantized and slots 32 .. 39 as written.
    k, v = _written(40)
    cache = _store(kvcache.KiviKVCache.init(cfg, 2, 48, SMALL), k[:, :29], v[:, :29])
    cache = _store(cache, k[:, 29:], v[:, 29:])
    read = cache.read(0, 0, 40)
    stored = cache.read_stored(0, 0, 40)
    for written, read, stored in zip((k, v), read, stored):
        written, read = np.asarray(written).swapaxes(1, 2), np.asarray(read)  # [B, K, T, H]
        np.testing.assert_array_equal(read[:, :, 32:], written[:, :, 32:])
        np.testing.assert_array_equal(read[:, :, :32], stored[:, :, :32])
        assert (read[:, :, :32] != written[:, :, :32]).any()


def test_int4_cache_bytes_really_shrink(cfg):
    # L 2, B 2, K 2, S 128, H 16, Kivi(): G 32 (4 key groups), one value group of 16 channels,
    # W = 0 + 31 + 16 = 47 float ring slots. Keys and values: 2 x 2*2*2*128*16 half bytes = 16384;
    # key scales and zeros: 2 x 2*2*2*4*16 x 4 = 4096; value scales and zeros: 2*2*2*128*2 x 4 =
    # 8192; ring: 2 x 2*2*2*47*16 x 4 = 48128. Float32: 2 x 2*2*2*128*16 x 4 = 131072.
    cache = dl.init_cache(cfg, 2, 128, "int4")
    assert isinstance(cache, kvcache.KiviKVCache)
    assert cache.nbytes() == 16384 + 4096 + 8192 + 48128
    floats = dl.init_cache(cfg, 2, 128, None)
    assert floats.k.nbytes + floats.v.nbytes == 131072
    # Per token: L K (4 H + 64 H / G + 4 H + 64) / 8 bits = 4 * (64 + 32 + 64 + 64) / 8 = 112
    # bytes against 2 L K H 4 = 512; int8: 2 L K (8 H + 32) / 8 = 160.
    assert [kvcache.bytes_per_token(cfg, kind) for kind in (None, "int8", "int4")] == [
        512, 160, 112]


def _piecewise(run, cfg, tokens, kind, cuts, blocking=attention.BLOCKING):
    """Logits of ``tokens [B, T]`` fed to a fresh cache in the blocks that ``cuts`` delimit."""
    cache = dl.init_cache(cfg, tokens.shape[0], 48, kind)
    pieces = []
    for start, end in zip(cuts[:-1], cuts[1:]):
        logits, cache = run(tokens[:, start:end], cache, blocking=blocking)
        pieces.append(logits)
    return jnp.concatenate(pieces, axis=1), cache


def test_int8_prefill_then_steps_matches_one_prefill(cfg, model, run):
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, TINY["vocab_size"], jnp.int32)
    whole, _ = _piecewise(run, cfg, tokens, "int8", [0, 12])
    pieces, _ = _piecewise(run, cfg, tokens, "int8", [0, 8, 9, 10, 11, 12])
    np.testing.assert_allclose(pieces, whole, atol=1e-5, rtol=1e-5)
    float_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    assert float(jnp.abs(whole - float_logits).max()) > 0  # the rounding reaches the logits


def test_int4_prefill_then_blocks_and_steps_match_one_prefill(cfg, model, run):
    """What a query reads depends only on the tokens up to it. (Equality holds while a block's
    projections round as the whole prefill's do: a different matmul shape can move an element
    across a rounding boundary, one quantization level; with int8 a 5-token block here does.)"""
    blocks_of_16 = attention.Blocking(slots=16)  # decode reads three blocks in a loop
    tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, TINY["vocab_size"], jnp.int32)
    whole, _ = _piecewise(run, cfg, tokens, SMALL, [0, 40], blocks_of_16)
    # 21 by the full-matrix path, a 5-token block across the group boundary at 24, then steps.
    pieces, _ = _piecewise(run, cfg, tokens, SMALL, [0, 21, 26, *range(27, 41)], blocks_of_16)
    np.testing.assert_allclose(pieces, whole, atol=1e-5, rtol=1e-5)
    float_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    assert float(jnp.abs(whole - float_logits).max()) > 1e-2  # the rounding reaches the logits


def test_int4_with_everything_in_the_residual_equals_the_float_cache(cfg, model, run):
    tokens = jax.random.randint(jax.random.key(3), (2, 40), 0, TINY["vocab_size"], jnp.int32)
    everything = kvcache.Kivi(group_size=8, residual=48)
    logits, _ = _piecewise(run, cfg, tokens, everything, [0, 21, 26, *range(27, 41)])
    float_logits = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_allclose(logits, float_logits, atol=1e-5, rtol=1e-5)


def test_int4_rewind_into_a_quantized_group_then_rewrite_is_exact(cfg, run):
    tokens = jax.random.randint(jax.random.key(4), (2, 40), 0, TINY["vocab_size"], jnp.int32)
    whole, _ = _piecewise(run, cfg, tokens, SMALL, [0, 40])
    _, cache = _piecewise(run, cfg, tokens, SMALL, [0, 21])
    # Position 21 right, 22 .. 26 wrong: the group of slots 16 .. 23 is completed and quantized
    # with two wrong tokens, then rewound into (row 0 keeps position 21, row 1 nothing).
    wrong = jnp.concatenate([tokens[:, 21:22], (tokens[:, 22:27] + 1) % TINY["vocab_size"]], 1)
    _, cache = run(wrong, cache)
    cache = cache.rewind(jnp.asarray([22, 21]))
    logits, cache = run(tokens[:, 22:27], cache, jnp.asarray([5, 0]))
    np.testing.assert_allclose(logits[0], whole[0, 22:27], atol=1e-5, rtol=1e-5)
    logits, cache = run(tokens[:, 21:27], cache, jnp.asarray([0, 6]))
    np.testing.assert_allclose(logits[1], whole[1, 21:27], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(cache.lengths, [27, 27])


def test_int4_rewind_deeper_than_max_rewind_is_rejected(cfg, run):
    tokens = jnp.zeros((2, 20), jnp.int32)
    _, cache = _piecewise(run, cfg, tokens, SMALL, [0, 20])
    cache.rewind(jnp.asarray([14, 0]))  # 6 back and back to 0 are exact
    with pytest.raises(ValueError, match=r"rewind lengths must be 0 or at most max_rewind=6 "
                                         r"slots below the current length .* got \[13, 20\]"):
        cache.rewind(jnp.asarray([13, 20]))


@pytest.mark.parametrize("kind", ["int8", TINY_GROUPS])
def test_greedy_speculative_with_a_quantized_cache_equals_greedy_generate_with_one(cfg, model,
                                                                                  kind):
    draft = dl.Transformer(cfg, rngs=nnx.Rngs(1))  # most proposals are rejected and rewound
    expected = dl.generate(model, PROMPTS, GREEDY, 12, seed=0, kv_cache=kind).token_lists()
    spec = dl.speculative_generate(model, draft, PROMPTS, GREEDY, gamma=3, max_new_tokens=12,
                                   seed=0, options=dl.SpeculativeOptions(kv_cache=kind))
    assert spec.token_lists() == expected
    floats = dl.generate(model, PROMPTS, GREEDY, 12, seed=0).token_lists()
    assert kind == "int8" or floats != expected  # int4 with groups of 4 changes some token


@pytest.mark.parametrize("kind", ["int8", TINY_GROUPS])
def test_engine_with_a_quantized_cache_generates_what_generate_does(model, kind):
    expected = dl.generate(model, PROMPTS, GREEDY, 10, seed=0, kv_cache=kind).token_lists()
    for chunk in (None, 2):  # whole prompts; chunks of 2 tokens between decode rounds
        engine = SlotEngine(model, num_slots=2, max_len=32, kv_cache=kind,
                            options=EngineOptions(prefill_chunk=chunk))
        done = engine.run([Request(id=i, prompt=p, max_new_tokens=10)
                           for i, p in enumerate(PROMPTS)])
        assert [done[i].tokens for i in range(len(PROMPTS))] == expected


@pytest.mark.parametrize("call", [
    lambda m: dl.generate(m, PROMPTS, GREEDY, 4, kv_cache="fp8"),
    lambda m: dl.speculative_generate(m, m, PROMPTS, GREEDY, 2, 4,
                                      options=dl.SpeculativeOptions(kv_cache="fp8")),
    lambda m: SlotEngine(m, num_slots=2, max_len=32, kv_cache="fp8"),
])
def test_unknown_kv_cache_kind_is_rejected_naming_the_argument(model, call):
    with pytest.raises(ValueError, match=r"kv_cache must be None \(float\) or one of "
                                         r"\('int8', 'int4'\), got 'fp8'"):
        call(model)


@pytest.mark.parametrize("fields, message", [
    (dict(group_size=0), r"group_size must be an int >= 1, got 0"),
    (dict(residual=-1), r"residual must be an int >= 0, got -1"),
    (dict(max_rewind=2.5), r"max_rewind must be an int >= 0, got 2.5"),
])
def test_bad_kivi_sizes_are_rejected(fields, message):
    with pytest.raises(ValueError, match=message):
        kvcache.Kivi(**fields)


def test_speculative_gamma_past_the_int4_rewind_depth_is_rejected(model):
    with pytest.raises(ValueError, match=r"gamma must be at most 3 with kv_cache=Kivi\(.*\), got "
                                         r"4"):
        dl.speculative_generate(model, model, PROMPTS, GREEDY, gamma=4, max_new_tokens=8,
                                options=dl.SpeculativeOptions(kv_cache=kvcache.Kivi(max_rewind=4)))
