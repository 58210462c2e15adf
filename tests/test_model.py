"""Transformer, position encodings and KVCache: the cache path equals the full forward pass.

The central check (maxtext's best test) is cache parity: for every position encoding and attention
layout, the logits of a full causal forward pass equal those of a ragged prefill followed by
chunked blocks and single-token decode steps through the KV cache, at float32 atol 1e-5.

Each model is built and jitted once per module (``build``); its functions take the parameters as an
argument, so each test case compiles one program per input shape and the tests share them.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab.model import attention
from decodelab.model.positions import (ALiBi, alibi_slopes, apply_rope, rope_frequencies, sinusoid,
                                       t5_relative_bucket)

ATOL = 1e-5  # float32: cache and full forward differ only in summation order

# Every position encoding, each RoPE scaling, every attention layout (the tiny config is GQA with
# 4 query and 2 kv heads), and the GPT-2-style layer-norm / GELU / untied variant.
CASES = {
    "learned": dict(position="learned"),
    "sinusoidal": dict(position="sinusoidal"),
    "t5": dict(position="t5"),
    "alibi": dict(position="alibi"),
    "rope": dict(position="rope"),
    "nope": dict(position="nope"),
    "rope-linear": dict(position="rope", rope_scaling="linear", rope_scaling_factor=4.0),
    "rope-ntk": dict(position="rope", rope_scaling="ntk", rope_scaling_factor=4.0),
    "rope-yarn": dict(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0),
    "rope-llama3": dict(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0,
                        rope_original_max_len=16),
    # Dynamic NTK past its original context of 8 (the sequences reach 24): each token's rotation
    # depends on its own position only, so full forward, step-by-step decoding, chunked prefill
    # and rewound verify blocks agree.
    "rope-dynamic": dict(position="rope", rope_scaling="dynamic", rope_scaling_factor=4.0,
                         rope_original_max_len=8),
    "mqa": dict(n_kv_heads=1),
    "mha": dict(n_kv_heads=4),
    "layernorm-gelu-untied": dict(norm="layer", mlp="gelu", tie_embeddings=False),
}
UNBOUNDED = [name for name in CASES if name != "learned"]

# Three rows of one true token sequence each; prompts of different lengths share one prefill block
# of width BLOCK, padded at the end with tokens that differ from the true ones.
V = 512
B, SEQ_LEN, BLOCK, MAX_LEN = 3, 24, 12, 32
SEQ = np.random.default_rng(0).integers(0, V, (B, SEQ_LEN)).astype(np.int32)  # [B, SEQ_LEN]
PROMPT_LENS = np.array([5, 12, 9], np.int32)
ONES = np.ones(B, np.int32)


def padded_block(start: np.ndarray, counts: np.ndarray, width: int) -> np.ndarray:
    """``[B, width]``: row b holds ``SEQ[b, start[b] : start[b] + counts[b]]``, then padding."""
    index = np.minimum(start[:, None] + np.arange(width)[None, :], SEQ_LEN - 1)  # [B, width]
    true = np.take_along_axis(SEQ, index, axis=1)
    wrong = (true + 1) % V  # never the true token, so attending padding would show
    return np.where(np.arange(width)[None, :] < counts[:, None], true, wrong)


def assert_rows_match(logits, full, start, counts):
    """``logits[b, :counts[b]]`` equals ``full[b, start[b] : start[b] + counts[b]]``."""
    for b in range(len(counts)):
        np.testing.assert_allclose(
            logits[b, : counts[b]], full[b, start[b] : start[b] + counts[b]], rtol=0, atol=ATOL,
            err_msg=f"row {b}",
        )


class Compiled:
    """A model plus its forward pass, jitted with the parameters as an argument (DESIGN.md §3)."""

    def __init__(self, cfg: dl.ModelConfig, blocking: attention.Blocking = attention.BLOCKING):
        self.cfg = cfg
        self.model = dl.Transformer(cfg, rngs=nnx.Rngs(0))
        graphdef, self.state = nnx.split(self.model)

        def forward(state, tokens):
            return nnx.merge(graphdef, state)(tokens)

        def extend(state, tokens, cache, num_valid):
            return nnx.merge(graphdef, state)(tokens, cache=cache, num_valid=num_valid,
                                              blocking=blocking)

        self._forward = jax.jit(forward)
        self._extend = jax.jit(extend)

    def forward(self, tokens) -> np.ndarray:
        return np.asarray(self._forward(self.state, jnp.asarray(tokens)))

    def extend(self, tokens, cache, num_valid) -> tuple[np.ndarray, dl.KVCache]:
        logits, cache = self._extend(self.state, jnp.asarray(tokens), cache,
                                     jnp.asarray(num_valid, jnp.int32))
        return np.asarray(logits), cache

    def prefill(self) -> tuple[np.ndarray, dl.KVCache]:
        """The ragged prompts ``SEQ[b, :PROMPT_LENS[b]]`` in one padded block."""
        cache = dl.KVCache.init(self.cfg, batch_size=B, max_len=MAX_LEN)
        return self.extend(padded_block(np.zeros(B, np.int32), PROMPT_LENS, BLOCK), cache,
                           PROMPT_LENS)


@pytest.fixture(scope="module")
def build(tiny_config):
    """``build(case)``: the case's Compiled model, built once per module."""
    built = {}

    def get(case: str) -> Compiled:
        if case not in built:
            built[case] = Compiled(tiny_config.replace(**CASES[case]))
        return built[case]

    return get


# --- Cache parity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_ragged_prefill_then_decode_matches_full_forward(build, case):
    m = build(case)
    full = m.forward(SEQ)
    logits, cache = m.prefill()
    assert_rows_match(logits, full, np.zeros(B, np.int32), PROMPT_LENS)
    np.testing.assert_array_equal(cache.lengths, PROMPT_LENS)
    for _ in range(8):
        start = np.asarray(cache.lengths)
        logits, cache = m.extend(padded_block(start, ONES, 1), cache, ONES)
        assert_rows_match(logits, full, start, ONES)
    np.testing.assert_array_equal(cache.lengths, PROMPT_LENS + 8)


# The default blocks hold all 32 slots; these runs split attention into several blocks (5 slots:
# six and a partial seventh that the read clamps back into range) for every position encoding, or
# force the full-matrix path over the cache (no block counts as short).
ATTENTION_PATHS = [
    *[(case, "blocks-of-5") for case in ("learned", "sinusoidal", "t5", "alibi", "rope", "nope",
                                         "mha")],
    *[(case, "full-matrix") for case in ("t5", "alibi", "rope")],
]
PATH_BLOCKING = {"blocks-of-5": attention.Blocking(slots=5),
                 "full-matrix": attention.Blocking(short=0)}


@pytest.mark.parametrize(("case", "path"), ATTENTION_PATHS)
def test_each_attention_path_matches_full_forward(tiny_config, case, path):
    m = Compiled(tiny_config.replace(**CASES[case]), PATH_BLOCKING[path])
    full = m.forward(SEQ)
    logits, cache = m.prefill()
    assert_rows_match(logits, full, np.zeros(B, np.int32), PROMPT_LENS)
    for _ in range(3):
        start = np.asarray(cache.lengths)
        logits, cache = m.extend(padded_block(start, ONES, 1), cache, ONES)
        assert_rows_match(logits, full, start, ONES)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(slots=0), r"^slots must be an int >= 1, got 0"),
    (dict(slots=16.0), r"^slots must be an int >= 1, got 16.0"),
    (dict(short=-1), r"^short must be an int >= 0, got -1"),
])
def test_bad_attention_blocks_are_rejected(fields, message):
    with pytest.raises(ValueError, match=message):
        attention.Blocking(**fields)


@pytest.mark.parametrize("case", ["rope", "t5", "alibi"])
def test_a_prefill_within_its_reach_equals_one_over_the_whole_cache(tiny_config, case):
    """``reach=T`` on a fresh cache makes a long block (the full-matrix path) read slots
    ``[0, T)`` only, a position bias included; the slots past them are in every query's future,
    so logits and cache equal a read of all ``max_len`` slots up to summation order, and decoding
    on from either gives the same logits."""
    full_matrix = PATH_BLOCKING["full-matrix"]
    m = Compiled(tiny_config.replace(**CASES[case]), full_matrix)
    block = padded_block(np.zeros(B, np.int32), PROMPT_LENS, BLOCK)

    def prefill(reach):
        cache = dl.KVCache.init(m.cfg, batch_size=B, max_len=MAX_LEN)
        return m.model(jnp.asarray(block), cache=cache, num_valid=jnp.asarray(PROMPT_LENS),
                       blocking=full_matrix, reach=reach)

    (near, near_cache), (whole, whole_cache) = prefill(BLOCK), prefill(None)
    for b, n in enumerate(PROMPT_LENS):
        np.testing.assert_allclose(near[b, :n], whole[b, :n], rtol=0, atol=ATOL)
    np.testing.assert_array_equal(near_cache.lengths, whole_cache.lengths)
    np.testing.assert_allclose(near_cache.k, whole_cache.k, rtol=0, atol=ATOL)  # layers > 0:
    np.testing.assert_allclose(near_cache.v, whole_cache.v, rtol=0, atol=ATOL)  # their order
    step = padded_block(np.asarray(near_cache.lengths), ONES, 1)
    after_near, _ = m.extend(step, near_cache, ONES)
    after_whole, _ = m.extend(step, whole_cache, ONES)
    np.testing.assert_allclose(after_near, after_whole, rtol=0, atol=ATOL)


@pytest.mark.parametrize("reach", [BLOCK - 1, 0, 8.0, "all"])
def test_a_reach_shorter_than_the_block_is_rejected(build, reach):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=B, max_len=MAX_LEN)
    with pytest.raises(ValueError, match=rf"^reach must be an int >= the block's {BLOCK} tokens"):
        m.model(jnp.zeros((B, BLOCK), jnp.int32), cache=cache, reach=reach)


def test_a_model_call_takes_only_a_blocking_as_its_blocks(build):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=B, max_len=MAX_LEN)
    with pytest.raises(ValueError, match=r"^blocking must be an attention.Blocking, got 16"):
        m.model(jnp.zeros((B, 1), jnp.int32), cache=cache, blocking=16)


@pytest.mark.parametrize("case", CASES)
def test_chunked_prefill_then_decode_matches_full_forward(build, case):
    m = build(case)
    full = m.forward(SEQ)
    _, cache = m.prefill()
    chunk = np.array([4, 2, 7], np.int32)  # a second ragged block, padded to width BLOCK
    logits, cache = m.extend(padded_block(PROMPT_LENS, chunk, BLOCK), cache, chunk)
    assert_rows_match(logits, full, PROMPT_LENS, chunk)
    for _ in range(2):  # decode overwrites the chunk's padding
        start = np.asarray(cache.lengths)
        logits, cache = m.extend(padded_block(start, ONES, 1), cache, ONES)
        assert_rows_match(logits, full, start, ONES)


@pytest.mark.parametrize("case", CASES)
def test_rewind_then_rewrite_matches_full_forward(build, case):
    """Speculative rollback: rejected draft tokens are dropped by moving each row's length back."""
    m = build(case)
    full = m.forward(SEQ)
    _, cache = m.prefill()
    accepted = np.array([1, 3, 0], np.int32)  # row b keeps its first accepted[b] of 4 draft tokens
    draft = padded_block(PROMPT_LENS, accepted, BLOCK)  # true tokens, then wrong ones
    _, cache = m.extend(draft, cache, np.full(B, 4, np.int32))
    cache = cache.rewind(PROMPT_LENS + accepted)
    counts = np.full(B, 4, np.int32)
    logits, cache = m.extend(padded_block(PROMPT_LENS + accepted, counts, BLOCK), cache, counts)
    assert_rows_match(logits, full, PROMPT_LENS + accepted, counts)


def test_row_logits_do_not_depend_on_batch_mates(build):
    m = build("rope")
    batch_logits, batch_cache = m.prefill()
    step = padded_block(PROMPT_LENS, ONES, 1)
    batch_step, _ = m.extend(step, batch_cache, ONES)

    row = 0  # shortest prompt: padded in the batch, alone it has other padding and no mates
    cache = dl.KVCache.init(m.cfg, batch_size=1, max_len=MAX_LEN)
    alone, cache = m.extend(padded_block(np.zeros(B, np.int32), PROMPT_LENS, BLOCK)[row:row + 1],
                            cache, PROMPT_LENS[row:row + 1])
    alone_step, _ = m.extend(step[row:row + 1], cache, ONES[:1])
    n = PROMPT_LENS[row]
    np.testing.assert_allclose(alone[0, :n], batch_logits[row, :n], rtol=0, atol=ATOL)
    np.testing.assert_allclose(alone_step[0], batch_step[row], rtol=0, atol=ATOL)


def test_jitted_write_past_max_len_is_dropped_not_wrapped(build):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=B, max_len=MAX_LEN).advance(
        jnp.full((B,), MAX_LEN - 2, jnp.int32))
    # Inside jit the room check cannot run: a block of 4 at length 30 has 2 slots left.
    _, cache = m.extend(padded_block(np.zeros(B, np.int32), np.full(B, 4), BLOCK), cache,
                        np.full(B, 4, np.int32))
    k = np.asarray(cache.k)  # [L, B, K, S, H]
    np.testing.assert_array_equal(k[:, :, :, : MAX_LEN - 2], 0.0)  # slots 0..29 untouched
    assert (np.abs(k[:, :, :, MAX_LEN - 2 :]).sum(axis=-1) > 0).all()  # the 2 slots left


# --- Positions beyond the training length ---------------------------------------------------------


@pytest.mark.parametrize("case", UNBOUNDED)
def test_positions_run_past_max_seq_len(build, case):
    m = build(case)
    tokens = np.random.default_rng(1).integers(0, V, (1, 2 * m.cfg.max_seq_len)).astype(np.int32)
    assert np.isfinite(m.forward(tokens)).all()


def test_padding_past_the_learned_table_gives_finite_logits(build):
    m = build("learned")  # a cache of max_seq_len slots, 4 left: the block's padding runs past 64
    cache = dl.KVCache.init(m.cfg, batch_size=1, max_len=m.cfg.max_seq_len).advance(jnp.array([60]))
    logits, cache = m.model(jnp.ones((1, 12), jnp.int32), cache=cache, num_valid=jnp.array([4]))
    assert np.isfinite(logits).all()
    np.testing.assert_array_equal(cache.lengths, [64])


def test_learned_positions_reject_a_longer_sequence(build):
    m = build("learned")
    tokens = jnp.zeros((1, m.cfg.max_seq_len + 1), jnp.int32)
    with pytest.raises(ValueError,
                       match=r"position='learned' has 64 positions.*sequence length 65"):
        m.model(tokens)


def test_learned_positions_reject_a_longer_cache(build):
    m = build("learned")
    cache = dl.KVCache.init(m.cfg, batch_size=1, max_len=m.cfg.max_seq_len + 1)
    with pytest.raises(ValueError, match=r"position='learned' has 64 positions.*cache max_len 65"):
        m.model(jnp.zeros((1, 1), jnp.int32), cache=cache)


# --- RoPE -----------------------------------------------------------------------------------------


def _rope_scores(cfg, q, k, q_pos, k_pos) -> np.ndarray:
    """``q . k`` after rotating q to each of ``q_pos`` and k to each of ``k_pos`` ([P] each)."""
    inv_freq, factor = rope_frequencies(cfg)
    P, H = len(q_pos), cfg.head_dim

    def rotated(x, pos):
        x = jnp.broadcast_to(jnp.asarray(x, jnp.float32), (1, P, 1, H))  # [B=1, T=P, 1, H]
        return apply_rope(x, jnp.asarray(pos, jnp.int32)[None, :], inv_freq, factor)

    return np.asarray(jnp.sum(rotated(q, q_pos) * rotated(k, k_pos), axis=-1))[0, :, 0]  # [P]


@pytest.fixture(scope="module")
def unit_qk(tiny_config):
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, tiny_config.head_dim))
    return q / np.linalg.norm(q), k / np.linalg.norm(k)


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn", "llama3"])
def test_rope_scores_depend_only_on_relative_position(tiny_config, unit_qk, scaling):
    cfg = tiny_config.replace(rope_scaling=scaling,
                              rope_scaling_factor=1.0 if scaling == "none" else 4.0)
    shifts = np.array([0, 1, 7, 64, 100, 1000])  # max_seq_len is 64
    scores = _rope_scores(cfg, *unit_qk, q_pos=9 + shifts, k_pos=4 + shifts)
    # Unit vectors, so |q . k| <= 1; float32 angles up to ~1000 rad leave errors of ~1e-6.
    np.testing.assert_allclose(scores, scores[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn", "llama3"])
def test_rope_scores_differ_for_different_relative_positions(tiny_config, unit_qk, scaling):
    cfg = tiny_config.replace(rope_scaling=scaling,
                              rope_scaling_factor=1.0 if scaling == "none" else 4.0)
    distances = np.arange(6)
    scores = _rope_scores(cfg, *unit_qk, q_pos=np.full(6, 9), k_pos=9 - distances)
    gaps = np.abs(scores[:, None] - scores[None, :])[np.triu_indices(6, k=1)]
    assert gaps.min() > 1e-4, scores  # 100x the float32 noise of the invariance test


def test_rope_linear_divides_every_frequency_by_the_factor(tiny_config):
    base, _ = rope_frequencies(tiny_config)
    linear, factor = rope_frequencies(tiny_config.replace(rope_scaling="linear",
                                                          rope_scaling_factor=4.0))
    np.testing.assert_allclose(linear, base / 4.0, rtol=1e-15)
    assert factor == 1.0


def test_rope_ntk_keeps_the_highest_and_interpolates_the_lowest_frequency(tiny_config):
    base, _ = rope_frequencies(tiny_config)
    ntk, factor = rope_frequencies(tiny_config.replace(rope_scaling="ntk", rope_scaling_factor=4.0))
    assert ntk[0] == base[0] == 1.0
    np.testing.assert_allclose(ntk[-1], base[-1] / 4.0, rtol=1e-12)
    assert factor == 1.0


def test_rope_yarn_keeps_fast_dims_interpolates_slow_dims_and_scales_by_its_factor(tiny_config):
    base, _ = rope_frequencies(tiny_config)
    yarn, factor = rope_frequencies(tiny_config.replace(rope_scaling="yarn",
                                                        rope_scaling_factor=4.0))
    # H=16, theta=1e4, original length 64: the ramp runs from dim 0 (32 rotations) to dim 3 (1).
    np.testing.assert_allclose(yarn[0], base[0], rtol=1e-12)
    np.testing.assert_allclose(yarn[3:], base[3:] / 4.0, rtol=1e-12)
    np.testing.assert_allclose(yarn[1:3], base[1:3] * (1 - np.array([1, 2]) / 3 * 0.75),
                               rtol=1e-12)
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-15)


def test_rope_llama3_keeps_short_wavelengths_interpolates_long_ones_and_blends_between(
        tiny_config):
    base, _ = rope_frequencies(tiny_config)
    cfg = tiny_config.replace(rope_scaling="llama3", rope_scaling_factor=8.0,
                              rope_original_max_len=64)
    llama3, factor = rope_frequencies(cfg)
    wavelength = 2 * np.pi / base
    short, long = wavelength < 64 / 4.0, wavelength > 64 / 1.0  # original / high, original / low
    np.testing.assert_allclose(llama3[short], base[short], rtol=1e-12)
    np.testing.assert_allclose(llama3[long], base[long] / 8.0, rtol=1e-12)
    between = ~short & ~long
    assert short.any() and long.any() and between.any()
    assert np.all((llama3[between] < base[between]) & (llama3[between] > base[between] / 8.0))
    assert factor == 1.0


def test_rope_dynamic_raises_the_base_only_for_rows_past_the_original_length(tiny_config):
    cfg = tiny_config.replace(rope_scaling="dynamic", rope_scaling_factor=4.0,
                              rope_original_max_len=16)
    base, _ = rope_frequencies(tiny_config)
    dynamic, factor = rope_frequencies(cfg, jnp.asarray([8, 16, 32], jnp.int32))
    H = tiny_config.head_dim
    theta = 1e4 * (4.0 * 32 / 16 - 3.0) ** (H / (H - 2))  # Hugging Face's dynamic NTK base
    expected = theta ** (-np.arange(0, H, 2) / H)
    np.testing.assert_allclose(np.asarray(dynamic), np.stack([base, base, expected]), rtol=1e-5)
    assert factor == 1.0


def test_rope_dynamic_ragged_prefill_matches_each_prompt_alone(tiny_config):
    # Prompts of 5, 12 and 9 tokens past an original length of 4: each token's frequencies come
    # from its own position, never from the block's padding or its batch-mates.
    m = Compiled(tiny_config.replace(rope_scaling="dynamic", rope_scaling_factor=4.0,
                                     rope_original_max_len=4))
    logits, _ = m.prefill()
    for b, n in enumerate(PROMPT_LENS):
        alone, _ = m.extend(SEQ[b:b + 1, :n], dl.KVCache.init(m.cfg, batch_size=1, max_len=MAX_LEN),
                            [n])
        np.testing.assert_allclose(logits[b, :n], alone[0], rtol=0, atol=ATOL, err_msg=f"row {b}")


# --- Sinusoids, ALiBi, T5 ------------------------------------------------------------------------


def test_sinusoid_interleaves_sin_and_cos_of_position_times_frequency():
    table = np.asarray(sinusoid(jnp.array([0, 1, 5]), 4))  # frequencies 1 and 10000^(-1/2)
    expected = np.array([[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)]
                         for p in (0, 1, 5)])
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-6)


def test_alibi_slopes_for_8_heads():
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-k for k in range(1, 9)])


def test_alibi_slopes_for_12_heads_follow_the_paper():
    # Press et al.: the 8-head slopes, then every other slope of 16 heads: 2^-0.5, 2^-1.5, ...
    expected = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_array_equal(alibi_slopes(12), expected)


def test_alibi_bias_is_minus_slope_times_distance(tiny_config):
    bias = ALiBi(tiny_config.replace(position="alibi"), rngs=nnx.Rngs(0)).bias(
        jnp.array([[3]]), jnp.array([[0, 1, 2, 3]]))  # [B=1, N=4, T=1, S=4]
    slopes = np.array([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])  # 4 heads
    expected = -slopes[:, None] * np.array([3, 2, 1, 0])[None, :]
    np.testing.assert_array_equal(np.asarray(bias)[0, :, 0], expected)


# Mesh TensorFlow / T5 `_relative_position_bucket`, bidirectional=False, 32 buckets, max distance
# 128: n < 16 is its own bucket, else min(31, 16 + floor(ln(n / 16) / ln(8) * 16)).
T5_BUCKETS = {
    0: 0,
    1: 1,
    15: 15,
    16: 16,  # ln(1) = 0
    20: 17,  # ln(1.25) / ln(8) * 16 = 1.72
    23: 18,  # ln(1.4375) / ln(8) * 16 = 2.79
    32: 21,  # 1/3 * 16 = 5.33
    45: 23,  # ln(2.8125) / ln(8) * 16 = 7.96
    64: 26,  # 2/3 * 16 = 10.67
    100: 30,  # ln(6.25) / ln(8) * 16 = 14.10
    127: 31,  # ln(7.9375) / ln(8) * 16 = 15.94
    128: 31,  # 16 + 16 = 32, clipped to the last bucket
    1000: 31,
}


def test_t5_buckets_match_the_published_function():
    distances = np.array(list(T5_BUCKETS))
    buckets = t5_relative_bucket(jnp.asarray(-distances), num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(buckets, list(T5_BUCKETS.values()))


def test_t5_future_keys_use_bucket_zero():
    buckets = t5_relative_bucket(jnp.array([1, 5, 16, 200]), num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(buckets, [0, 0, 0, 0])


# --- KVCache --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_init_shapes_and_dtypes(tiny_config, dtype):
    cache = dl.KVCache.init(tiny_config.replace(dtype=dtype), batch_size=3, max_len=10)
    assert cache.k.shape == cache.v.shape == (2, 3, 2, 10, 16)  # [L, B, K, S, H]
    assert cache.k.dtype == cache.v.dtype == jnp.dtype(dtype)
    assert cache.lengths.dtype == jnp.int32
    np.testing.assert_array_equal(cache.lengths, [0, 0, 0])
    assert (cache.batch_size, cache.max_len) == (3, 10)


def test_cache_init_dtype_argument_overrides_config(tiny_config):
    assert dl.KVCache.init(tiny_config, 1, 4, dtype=jnp.bfloat16).k.dtype == jnp.bfloat16


@pytest.mark.parametrize("name", ["batch_size", "max_len"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_cache_init_rejects_bad_sizes(tiny_config, name, value):
    sizes = {"batch_size": 2, "max_len": 8, name: value}
    with pytest.raises(ValueError, match=f"^{name} must be a positive int"):
        dl.KVCache.init(tiny_config, **sizes)


def test_cache_init_rejects_a_missing_config():
    with pytest.raises(ValueError, match="^cfg must be a ModelConfig, got None"):
        dl.KVCache.init(None, batch_size=2, max_len=8)


@pytest.mark.parametrize("dtype", ["float7", "int8", jnp.int32])
def test_cache_init_rejects_a_dtype_that_is_not_float(tiny_config, dtype):
    with pytest.raises(ValueError, match="^dtype must be a float dtype"):
        dl.KVCache.init(tiny_config, 2, 8, dtype=dtype)


@pytest.mark.parametrize("lengths", [[1, 1, 1], "a", 1.7, [1.0, 2.0], True, [[1, 1]]],
                         ids=["three-for-two-rows", "str", "float", "floats", "bool", "2-d"])
def test_cache_rewind_rejects_lengths_that_are_not_one_int_per_row(tiny_config, lengths):
    cache = dl.KVCache.init(tiny_config, 2, 8).advance(jnp.array([5, 6]))
    with pytest.raises(ValueError, match="^lengths must be an int or one int per row"):
        cache.rewind(lengths)


def test_cache_positions_start_at_each_rows_length(tiny_config):
    cache = dl.KVCache.init(tiny_config, 2, 8).advance(jnp.array([0, 2]))
    np.testing.assert_array_equal(cache.positions(3), [[0, 1, 2], [2, 3, 4]])


def test_cache_rewind_sets_lengths_back_per_row(tiny_config):
    cache = dl.KVCache.init(tiny_config, 3, 8).advance(jnp.array([5, 6, 7]))
    np.testing.assert_array_equal(cache.rewind(jnp.array([2, 6, 0])).lengths, [2, 6, 0])
    np.testing.assert_array_equal(cache.rewind(4).lengths, [4, 4, 4])


@pytest.mark.parametrize(
    "lengths", [[6, 6, 6], [5, 6, 8], [-1, 0, 0]], ids=["forward", "one-row-forward", "negative"])
def test_cache_rewind_outside_zero_to_current_length_is_rejected(tiny_config, lengths):
    cache = dl.KVCache.init(tiny_config, 3, 8).advance(jnp.array([5, 6, 7]))
    with pytest.raises(ValueError, match=r"^rewind lengths must be in \[0, current length\]"):
        cache.rewind(jnp.array(lengths))


def test_cache_write_inside_jit_drops_out_of_range_slots(tiny_config):
    cache = dl.KVCache.init(tiny_config, 2, 8).advance(jnp.array([6, 0]))
    # [B, T, K, H]: token t carries the value t + 1; row 0 has 2 slots left for 3 tokens.
    k = jnp.broadcast_to(jnp.arange(1.0, 4.0)[None, :, None, None], (2, 3, 2, 16))
    cache = jax.jit(lambda c, k, v: c.write(1, k, v))(cache, k, 2 * k)
    written = np.asarray(cache.k[1, :, :, :, 0])  # [B, K, S]
    np.testing.assert_array_equal(written, [[[0, 0, 0, 0, 0, 0, 1, 2]] * 2,
                                            [[1, 2, 3, 0, 0, 0, 0, 0]] * 2])
    np.testing.assert_array_equal(cache.v[1, :, :, :, 0], 2 * written)
    np.testing.assert_array_equal(cache.k[0], 0.0)  # other layers untouched
    np.testing.assert_array_equal(cache.lengths, [6, 0])  # write does not advance


def test_block_past_max_len_is_rejected_as_cache_full(build):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=2, max_len=8).advance(jnp.array([3, 6]))
    with pytest.raises(ValueError,
                       match=r"^cache is full: row 1 has length 6 and the block adds 3"):
        m.model(jnp.zeros((2, 3), jnp.int32), cache=cache)


# --- Bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 512])
def test_tokens_out_of_vocab_are_rejected(build, bad):
    with pytest.raises(ValueError, match=rf"^tokens must be ids in \[0, 512\), got {bad}"):
        build("rope").model(jnp.array([[0, bad, 1]]))


def test_float_tokens_are_rejected(build):
    with pytest.raises(ValueError, match="^tokens must be integer ids"):
        build("rope").model(jnp.zeros((1, 3), jnp.float32))


def test_batch_size_different_from_the_caches_is_rejected(build):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=3, max_len=8)
    with pytest.raises(ValueError, match="^tokens batch size must equal the cache's, got 2 and 3"):
        m.model(jnp.zeros((2, 1), jnp.int32), cache=cache)


@pytest.mark.parametrize("num_valid", [[-1, 2], [2, 5]])
def test_num_valid_outside_zero_to_block_length_is_rejected(build, num_valid):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=2, max_len=8)
    with pytest.raises(ValueError, match=r"^num_valid must be in \[0, T=4\] per row"):
        m.model(jnp.zeros((2, 4), jnp.int32), cache=cache, num_valid=jnp.array(num_valid))


@pytest.mark.parametrize("num_valid", [[1.9, 0.5], np.array([2.0, 1.0]), [True, False]])
def test_num_valid_that_is_not_integers_is_rejected_not_truncated(build, num_valid):
    m = build("rope")
    cache = dl.KVCache.init(m.cfg, batch_size=2, max_len=8)
    with pytest.raises(ValueError, match=r"^num_valid must be 2 ints in \[0, T=4\]"):
        m.model(jnp.zeros((2, 4), jnp.int32), cache=cache, num_valid=num_valid)


def test_num_valid_without_cache_is_rejected(build):
    with pytest.raises(ValueError, match="^num_valid is only meaningful with a cache"):
        build("rope").model(jnp.zeros((2, 4), jnp.int32), num_valid=jnp.array([4, 4]))


@pytest.mark.parametrize("tokens, message", [
    ("To be", r"^tokens must be an int array \[B, T\] of token ids, got a str \('To be'\)"),
    ([["a", "b"]], r"^tokens must be an int array \[B, T\] of token ids, got list"),
    (np.zeros((1, 0), np.int32), r"^tokens must hold at least one row of at least one token, got "
                                 r"shape \(1, 0\)"),
    (np.zeros((0, 3), np.int32), r"^tokens must hold at least one row of at least one token, got "
                                 r"shape \(0, 3\)"),
])
def test_tokens_that_are_not_a_non_empty_id_array_are_rejected(build, tokens, message):
    with pytest.raises(ValueError, match=message):
        build("rope").model(tokens)


# --- Overflow inside the forward pass -------------------------------------------------------------


def test_a_position_whose_activations_overflow_gets_nan_logits_and_the_others_do_not(build):
    # Token 7's embedding times 1e30: its square overflows float32, which the norms would turn into
    # zeros (uniform-looking logits). Only that position is affected: what later positions attend
    # to there is the norm's zeros, which are finite.
    model = dl.Transformer(build("rope").cfg, rngs=nnx.Rngs(0))
    model.embed.embedding[...] = model.embed.embedding[...].at[7].multiply(1e30)
    logits = np.asarray(model(jnp.array([[1, 7, 2]])))
    assert np.isnan(logits[0, 1]).all()
    assert np.isfinite(logits[0, [0, 2]]).all()


@pytest.fixture(scope="module")
def overflowing(tiny_config):
    """The tiny model with every parameter scaled by 1e20: every activation overflows."""
    graphdef, state = nnx.split(dl.Transformer(tiny_config.replace(position="rope"),
                                               rngs=nnx.Rngs(0)))
    return nnx.merge(graphdef, jax.tree.map(lambda p: p * 1e20, state))


def test_generate_reports_an_overflowing_forward_pass_as_an_error(overflowing):
    out = dl.generate(overflowing, [[1, 2, 3], [4, 5]], dl.SamplingParams.greedy(), 4, seed=0,
                      options=dl.DecodeOptions(raise_on_error=False))
    assert out.finish_reason == ["error", "error"]
    assert out.lengths.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"row 0 after 0 tokens: the model's logits hold NaN"):
        dl.generate(overflowing, [[1, 2, 3]], dl.SamplingParams.greedy(), 4, seed=0)


# --- bfloat16 -------------------------------------------------------------------------------------


def test_bfloat16_logits_are_finite_and_close_to_float32(build):
    m32 = build("rope")
    m16 = Compiled(m32.cfg.replace(dtype="bfloat16"))  # same seed: the same float32 parameters
    assert {p.dtype for p in jax.tree.leaves(m16.state)} == {jnp.dtype("float32")}
    full32, full16 = m32.forward(SEQ), m16.forward(SEQ)
    assert full16.dtype == np.float32 and np.isfinite(full16).all()
    # Logits have std ~1; bf16 keeps 8 mantissa bits (relative error 2^-9 per rounding) and two
    # layers round a few dozen times, so expect ~0.05 and allow 0.1 (10% of the logit std).
    np.testing.assert_allclose(full16, full32, rtol=0, atol=0.1)
    logits, cache = m16.prefill()
    assert cache.k.dtype == jnp.bfloat16 and np.isfinite(logits).all()


def test_taps_return_the_residual_stream_and_head_is_the_models_exit(build):
    """``taps`` returns the stream entering each named block (0: the embeddings, n_layers: the
    last block's output), and ``head`` of the last tap is the model's own logits, with and
    without a cache."""
    m = build("layernorm-gelu-untied")
    L = m.cfg.n_layers
    tokens = jnp.asarray(SEQ[:, :BLOCK])
    logits, hidden = m.model(tokens, taps=(0, L))
    assert hidden.shape == (2, B, BLOCK, m.cfg.d_model)
    np.testing.assert_allclose(logits, m.model(tokens), rtol=0, atol=0)
    np.testing.assert_allclose(m.model.head(hidden[1]), logits, rtol=0, atol=ATOL)
    embedded = m.model.positions.embed(m.model.embed(tokens),
                                       jnp.broadcast_to(jnp.arange(BLOCK), (B, BLOCK)))
    np.testing.assert_allclose(hidden[0], embedded, rtol=0, atol=ATOL)
    cache = dl.KVCache.init(m.cfg, batch_size=B, max_len=MAX_LEN)
    cached, _, tapped = m.model(tokens, cache=cache, taps=(L,))
    np.testing.assert_allclose(cached, logits, rtol=0, atol=ATOL)
    np.testing.assert_allclose(tapped[0], hidden[1], rtol=0, atol=ATOL)


@pytest.mark.parametrize("taps", [(3,), (-1,), [1], (1, 1), (0.0,)])
def test_bad_taps_are_rejected(build, taps):
    m = build("rope")
    with pytest.raises(ValueError, match=r"^taps must be a tuple of distinct layer indices in "
                                         rf"\[0, {m.cfg.n_layers}\], got"):
        m.model(jnp.zeros((B, 4), jnp.int32), taps=taps)


def compiled_step_text(model: dl.Transformer) -> str:
    """The optimized HLO of one decode step (one token per row, a cache of 16 slots)."""
    graphdef, state = nnx.split(model)
    step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s)(t, cache=c))
    cache = dl.KVCache.init(model.config, batch_size=1, max_len=16)
    return step.lower(state, jnp.zeros((1, 1), jnp.int32), cache).compile().as_text()


def kernel_copies(text: str) -> list[str]:
    """The step's instructions that copy or transpose a projection kernel it takes as a
    parameter (a weight matrix rewritten at every step)."""
    entry = text[text.index("ENTRY"):].splitlines()
    kernels = [line.split("=")[0].strip() for line in entry
               if "parameter(" in line and "kernel" in line]
    return [line for line in entry if re.match(r"\s*(ROOT )?%\w*(copy|transpose)", line)
            and any(re.search(re.escape(k) + r"\b", line.split("=", 1)[1]) for k in kernels)]


def test_a_decode_step_reads_each_kernel_as_stored_without_copying_it(tiny_config):
    """The output projection contracts two kernel axes (heads, head width): jnp.einsum lists
    them in another order than the kernel's, and XLA then transposed the whole kernel at every
    step. ``layers.kernel_order_einsum`` contracts them in the kernel's order: no copy."""
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    assert kernel_copies(compiled_step_text(model)) == []
    einsum = nnx.clone(model)  # the same model through jnp.einsum: the copies this test sees
    for _, module in nnx.iter_modules(einsum):
        if isinstance(module, nnx.Einsum):
            module.einsum_op = jnp.einsum
    assert len(kernel_copies(compiled_step_text(einsum))) == tiny_config.n_layers
