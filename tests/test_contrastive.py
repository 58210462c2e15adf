"""contrastive_search(): alpha 0 is greedy decoding; a plain reference (a full forward per
candidate, no cache, NumPy cosines) picks the same tokens; rows are independent of their
batch-mates; the program compiles once across alphas; bad input is refused before anything is
traced."""

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
from flax import nnx
from standins import Pieces

import decodelab as dl
from decodelab import experiment, sampling
from decodelab.decode import contrastive
from decodelab.decode.request import OutputSpec, RowInputs

PROMPTS = [[5, 17, 300, 2], [9], list(range(40, 60))]  # row 2 alone is in bucket 32
N = 6


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def forward(tiny):
    """``tokens [R, 32] -> (logits [R, 32, V], normed last-block stream [R, 32, D])``: a full
    forward, no cache."""
    graphdef, weights = nnx.split(tiny)

    @jax.jit
    def run(weights, tokens):
        model = nnx.merge(graphdef, weights)
        logits, stream = model(tokens, taps=(model.config.n_layers,))
        return logits, model.final_norm(stream[0])

    return lambda tokens: tuple(np.asarray(x, np.float64) for x in run(weights, tokens))


def reference(forward, prompt, alpha, k, steps):
    """The definition, one candidate at a time: run prompt + output + v for each of the k
    tokens v of largest logit, score ``(1 - alpha) p(v) - alpha max_j cos(h_v, h_j)`` over every
    earlier position j, keep the best. Returns the tokens and their log-probabilities."""
    seq, logprobs = list(prompt), []
    for _ in range(steps):
        t = len(seq)
        logits = forward(np.asarray([seq + [0] * (32 - t)], np.int32))[0][0, t - 1]
        logp = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        candidates = np.argsort(-logits, kind="stable")[:k]
        block = np.zeros((k, 32), np.int32)
        block[:, :t], block[:, t] = seq, candidates
        hidden = forward(block)[1]  # [k, 32, D]
        unit = hidden / np.linalg.norm(hidden, axis=-1, keepdims=True)
        cosine = np.einsum("kd,kjd->kj", unit[:, t], unit[:, :t])
        scores = (1 - alpha) * np.exp(logp[candidates]) - alpha * cosine.max(axis=1)
        token = int(candidates[np.argmax(scores)])
        seq.append(token)
        logprobs.append(logp[token])
    return seq[len(prompt):], logprobs


@pytest.mark.parametrize("kind", [None, "int8"])
def test_keeping_a_candidate_copies_its_newest_slot_only(kind):
    """Rows 0, 1 take row 1's newest slot and rows 2, 3 row 2's, in every layer, exactly (an int8
    slot is dequantized and quantized again to the same values and scale); nothing else moves."""
    cfg = dl.ModelConfig(vocab_size=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         position="nope")
    cache = dl.init_cache(cfg, 4, 8, kind)
    rng = np.random.default_rng(0)
    for layer in range(2):
        k, v = (jnp.asarray(rng.normal(size=(4, 3, 2, 16)), jnp.float32) for _ in range(2))
        cache = cache.write(layer, 3 * k, v)
    cache = cache.advance(jnp.full((4,), 3))
    kept = contrastive.keep_newest_slot(cache, jnp.asarray([1, 1, 2, 2]), 2)
    np.testing.assert_array_equal(kept.lengths, cache.lengths)
    for before, after in zip(jax.tree.leaves(cache), jax.tree.leaves(kept)):
        if before.ndim == 5:  # [L, B, K, S, ...]: keys, values, scales
            before, after = np.asarray(before), np.asarray(after)
            np.testing.assert_array_equal(after[:, :, :, 2], before[:, [1, 1, 2, 2]][:, :, :, 2])
            np.testing.assert_array_equal(after[:, :, :, :2], before[:, :, :, :2])


def test_alpha_zero_is_greedy_decoding(tiny):
    out = dl.contrastive_search(tiny, PROMPTS, penalty_alpha=0.0, top_k=4, max_new_tokens=N)
    assert out.token_lists() == dl.decode.greedy(tiny, PROMPTS, N)
    assert out.finish_reason == ["length"] * 3


@pytest.mark.parametrize("alpha, k", [(0.6, 4), (0.9, 4), (0.3, 3)])
def test_matches_the_plain_reference(tiny, forward, alpha, k):
    """Also the logprobs: each chosen token's log-probability under the model."""
    out = dl.contrastive_search(tiny, PROMPTS, penalty_alpha=alpha, top_k=k, max_new_tokens=N)
    for p, prompt in enumerate(PROMPTS):
        tokens, logprobs = reference(forward, prompt, alpha, k, N)
        assert out.token_lists()[p] == tokens
        np.testing.assert_allclose(out.logprobs[p], logprobs, rtol=0, atol=1e-5)


def test_a_row_depends_only_on_its_own_prompt_and_alpha(tiny):
    """Ragged prompts with one alpha each: each row's output is the same in another position of
    the batch and beside other batch-mates (of the same shapes: the same program), and the
    compiled loop gives the Python twin's tokens."""
    alphas = [0.3, 0.6, 0.8]
    together = dl.contrastive_search(tiny, PROMPTS, alphas, 4, N)
    order = [2, 0, 1]
    moved = dl.contrastive_search(tiny, [PROMPTS[p] for p in order], [alphas[p] for p in order],
                                  4, N, options=dl.DecodeOptions(python_loop=True))
    others = dl.contrastive_search(tiny, [PROMPTS[0], [7, 7], list(range(100, 125))],
                                   [alphas[0], 0.1, 0.0], 4, N)
    for position, p in enumerate(order):
        assert moved.token_lists()[position] == together.token_lists()[p]
        np.testing.assert_allclose(moved.logprobs[position], together.logprobs[p], rtol=0,
                                   atol=1e-6)
    assert others.token_lists()[0] == together.token_lists()[0]
    np.testing.assert_allclose(others.logprobs[0], together.logprobs[0], rtol=0, atol=1e-6)


def test_an_eos_id_ends_the_row_and_is_kept(tiny):
    free = dl.contrastive_search(tiny, PROMPTS, 0.6, 4, N)
    eos = free.token_lists()[1][2]
    first = [row.index(eos) + 1 if eos in row else N for row in free.token_lists()]
    out = dl.contrastive_search(tiny, PROMPTS, 0.6, 4, N, options=dl.DecodeOptions(eos_ids=eos))
    np.testing.assert_array_equal(out.lengths, first)
    assert out.token_lists() == [row[:n] for row, n in zip(free.token_lists(), first)]
    assert out.finish_reason[1] == "eos"
    assert np.isnan(out.logprobs[1, first[1]:]).all() and (out.tokens[1, first[1]:] == -1).all()


def test_alphas_and_prompt_lengths_compile_once_and_k_is_static(tiny):
    jax.clear_caches()  # no earlier test's program (of these shapes, or of k = 3) stands in
    with experiment.count_traces() as counts:
        for i, alpha in enumerate([0.1, 0.5, 0.9]):
            dl.contrastive_search(tiny, [[1] * (i + 1), [2, 3]], alpha, 2, 4)
        assert counts["_contrastive_loop"] == 1 and counts["contrastive_prefill"] == 1
        dl.contrastive_search(tiny, [[1], [2, 3]], 0.5, 3, 4)
        assert counts["_contrastive_loop"] == 2


def test_the_loop_picks_its_candidates_without_a_sort(tiny):
    """The k candidates come from k argmax passes (``select.largest``): the loop's jaxpr holds no
    ``top_k`` and no ``sort``, which XLA on CPU compiled into a sort of every row's vocabulary
    at every step."""
    B, V, K = 2, tiny.config.vocab_size, 4
    graphdef, weights = nnx.split(tiny)
    rows = RowInputs(prompt_lengths=np.asarray([3, 1], np.int32), keys=sampling.batch_keys(0, B),
                     params=dl.SamplingParams.greedy().per_row(B, V),
                     eos_mask=np.zeros((V,), bool), stop_ids=np.zeros((0, 1), np.int32))
    inputs = contrastive.ContrastiveInputs(rows=rows, alpha=np.full((B,), 0.5, np.float32),
                                           usable=np.ones((V,), bool))
    state = contrastive.contrastive_prefill(
        weights, np.ones((B, 8), np.int32), inputs, graphdef=graphdef, top_k=K, max_len=16,
        outputs=OutputSpec(4, 0, False))
    found = programs.primitives(contrastive.CONTRASTIVE_LOOP.loop, weights, state,
                                graphdef=graphdef)
    assert found["while"] >= 1 and found["argmax"] >= K
    assert found["sort"] == found["top_k"] == 0


def test_a_padded_vocabulary_is_never_a_candidate_with_its_tokenizer(tiny):
    """The tiny model's vocabulary read as 30 ids and padding: without the tokenizer its choices
    are mostly padding; with it none is, and a top_k past its size is refused."""
    bare = dl.contrastive_search(tiny, PROMPTS, 0.6, 4, N)
    assert (bare.tokens >= 30).any()
    options = dl.DecodeOptions(tokenizer=Pieces(30))
    out = dl.contrastive_search(tiny, PROMPTS, 0.6, 4, N, options=options)
    assert ((out.tokens >= 0) & (out.tokens < 30)).all() and np.isfinite(out.logprobs).all()
    with pytest.raises(ValueError, match="top_k must be <= the tokenizer's size 30, got 31"):
        dl.contrastive_search(tiny, PROMPTS, 0.6, 31, N, options=options)


def test_nan_logits_raise_or_end_the_row_with_an_error(tiny_config):
    broken = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    broken.final_norm.scale[...] = jnp.nan
    with pytest.raises(ValueError, match=r"row 0 after 0 tokens: the model's logits hold NaN"):
        dl.contrastive_search(broken, PROMPTS, 0.6, 4, N)
    out = dl.contrastive_search(broken, PROMPTS, 0.6, 4, N,
                                options=dl.DecodeOptions(raise_on_error=False))
    assert out.finish_reason == ["error"] * 3 and (out.lengths == 0).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(penalty_alpha=1.5), r"penalty_alpha must be a finite number in \[0, 1\], got 1.5"),
    (dict(penalty_alpha=-0.1), r"penalty_alpha must be a finite number in \[0, 1\], got -0.1"),
    (dict(penalty_alpha=float("nan")), r"penalty_alpha must be a finite number in \[0, 1\]"),
    (dict(penalty_alpha=[0.5, 2.0]), r"penalty_alpha\[1\] must be a finite number in \[0, 1\], "
                                     r"got 2.0"),
    (dict(penalty_alpha=[0.5]), r"penalty_alpha has 1 values but there are 2 prompts"),
    (dict(top_k=0), r"top_k must be an int in \[1, vocab_size=512\], got 0"),
    (dict(top_k=513), r"top_k must be an int in \[1, vocab_size=512\], got 513"),
    (dict(top_k=2.0), r"top_k must be an int in \[1, vocab_size=512\], got 2.0"),
    (dict(max_new_tokens=0), r"max_new_tokens must be an int >= 1, got 0"),
    (dict(prompts=[[1], []]), r"prompts\[1\] is empty"),
    (dict(kv_cache="int4"), r"kv_cache must be None or 'int8' for contrastive search"),
    (dict(options=dl.DecodeOptions(eos_ids=[512])), r"eos_ids must be token ids in \[0, 512\)"),
])
def test_bad_input_is_rejected_before_anything_is_traced(tiny, kwargs, message):
    args = dict(prompts=[[1], [2, 3]], penalty_alpha=0.5, top_k=2, max_new_tokens=3) | kwargs
    with experiment.count_traces() as counts, pytest.raises(ValueError, match=message):
        dl.contrastive_search(tiny, **args)
    assert not counts
