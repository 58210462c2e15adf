"""generate(): exact outputs from a stand-in model, parity with the real Transformer, batch
invariance, compile counting and bad input.

The stand-in (``standins.NextToken``) has the Transformer's call signature over a real KVCache.
Its next token is ``(last + 1) % V`` by a margin of 10 logits, where "last" is read back from the
cache slot the engine says the token sits at; with ``rule="position"`` the next token is instead
``(position + 1) % V``, which exposes any error in the per-row lengths. Either way the expected
outputs are exact.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx
from standins import Letters, NextToken, Pieces, padded_next_token

import decodelab as dl
from decodelab import experiment
from decodelab.decode import generation as decode
from decodelab.measure import compiles

V = 32
GREEDY = dl.SamplingParams.greedy()


@pytest.fixture(scope="module")
def stand_in():
    return NextToken()


def run(model, prompts, max_new_tokens, params=GREEDY, **kwargs):
    return dl.generate(model, prompts, params, max_new_tokens, **kwargs)


def opts(**fields):
    """``generate``'s keyword arguments with these ``DecodeOptions`` fields."""
    return dict(options=dl.DecodeOptions(**fields))


# --- Exact outputs from the stand-in --------------------------------------------------------------


def test_ragged_prompts_continue_each_from_its_own_last_token(stand_in):
    out = run(stand_in, [[3], [5, 6, 7], [10, 11]], 4)
    np.testing.assert_array_equal(out.tokens, [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]])
    np.testing.assert_array_equal(out.lengths, [4, 4, 4])
    assert out.finish_reason == ["length"] * 3


def test_each_row_decodes_at_its_own_positions():
    out = run(NextToken(rule="position"), [[9], [9, 9, 9], [9, 9]], 3)
    np.testing.assert_array_equal(out.tokens, [[1, 2, 3], [3, 4, 5], [2, 3, 4]])


def test_eos_ends_a_row_and_is_kept_while_others_continue(stand_in):
    out = run(stand_in, [[3], [5], [20]], 5, options=dl.DecodeOptions(eos_ids=[7, 22]))
    np.testing.assert_array_equal(out.tokens, [[4, 5, 6, 7, -1], [6, 7, -1, -1, -1],
                                               [21, 22, -1, -1, -1]])
    np.testing.assert_array_equal(out.lengths, [4, 2, 2])
    assert out.finish_reason == ["eos"] * 3
    assert np.isnan(out.logprobs[1, 2:]).all() and not np.isnan(out.logprobs[1, :2]).any()


def test_min_new_tokens_suppresses_eos_until_reached(stand_in):
    # row 0 reaches EOS as its 3rd token (allowed); row 1 would at its 2nd (suppressed: the argmax
    # of the rest is the lowest id, 0, among ties at 0)
    out = run(stand_in, [[4], [5]], 4, dl.SamplingParams(temperature=0.0, min_new_tokens=[2, 3]),
              options=dl.DecodeOptions(eos_ids=7))
    assert out.token_lists() == [[5, 6, 7], [6, 0, 1, 2]]
    assert out.finish_reason == ["eos", "length"]


def test_stop_sequence_ends_a_row_inside_the_loop(stand_in):
    out = run(stand_in, [[5], [1], [12]], 6,
              options=dl.DecodeOptions(stop_sequences=[[8, 9], [14]]))
    assert out.token_lists() == [[6, 7, 8, 9], [2, 3, 4, 5, 6, 7], [13, 14]]
    assert out.finish_reason == ["stop", "length", "stop"]


def test_stop_sequence_must_lie_in_the_output(stand_in):
    # the prompt ends with 8; the output's 9 completes "8 9" only across the prompt boundary
    out = run(stand_in, [[7, 8]], 3, options=dl.DecodeOptions(stop_sequences=[[8, 9]]))
    assert out.token_lists() == [[9, 10, 11]] and out.finish_reason == ["length"]


def test_stop_strings_cut_after_the_token_that_completes_them(stand_in):
    # row 0: "efg" -> "fg" is found in the loop from its tokens [5, 6];
    # row 1: "GH" "IJ" contains "HI" across a token boundary, found in the decoded text
    out = run(stand_in, [[3], [28]], 6,
              options=dl.DecodeOptions(stop_strings=["fg", "HI"], tokenizer=Letters()))
    assert out.token_lists() == [[4, 5, 6], [29, 30]]
    assert out.finish_reason == ["stop", "stop"]
    assert out.tokens[1, 2:].tolist() == [-1] * 4 and np.isnan(out.logprobs[1, 2:]).all()


def test_budget_and_cache_capacity_finish_with_length(stand_in):
    # max_len 6: the 4-token prompt leaves room for 2 tokens, the 1-token prompt for 5 of 8 asked
    out = run(stand_in, [[1, 2, 3, 4], [10]], 8, **opts(max_len=6))
    assert out.token_lists() == [[5, 6], [11, 12, 13, 14, 15]]
    assert out.finish_reason == ["length", "length"]


def test_greedy_logprobs_are_zero_and_sampled_logprobs_are_the_processed_distribution():
    base = np.linspace(0.0, 2.0, V)
    model = NextToken(margin=1.0, base=base)
    params = dl.SamplingParams(temperature=0.5, top_k=8)
    out = run(model, [[3], [3]], 3, params, seed=[0, 1],
              options=dl.DecodeOptions(return_top_logprobs=4, return_entropy=True))
    logits = np.tile(base + 1.0 * (np.arange(V) == 4), (2, 1))  # the first step follows token 3
    processed = dl.sampling.process_logits(jnp.asarray(logits, jnp.float32), params.per_row(2, V),
                                           _empty_history())
    for row in range(2):
        expected = jax.nn.log_softmax(processed, axis=-1)[row]
        chosen = out.tokens[row, 0]
        np.testing.assert_allclose(out.logprobs[row, 0], expected[chosen], rtol=0, atol=1e-6)
        np.testing.assert_allclose(out.top_logprobs[row, 0], np.sort(expected)[::-1][:4], atol=1e-6)
        kept = np.asarray(expected)[np.asarray(expected) > -np.inf]
        entropy = -np.sum(np.exp(kept) * kept)
        np.testing.assert_allclose(out.entropy[row, 0], entropy, rtol=0, atol=1e-5)
    greedy = run(model, [[3]], 3,
                 options=dl.DecodeOptions(return_top_logprobs=2, return_entropy=True))
    np.testing.assert_array_equal(greedy.logprobs, [[0, 0, 0]])
    np.testing.assert_array_equal(greedy.entropy, [[0, 0, 0]])
    np.testing.assert_array_equal(greedy.top_logprobs[0, :, 1], [-np.inf] * 3)


def _empty_history():
    return dl.sampling.History(tokens=jnp.zeros((2, 1), jnp.int32),
                               prompt_lengths=jnp.zeros((2,), jnp.int32),
                               lengths=jnp.zeros((2,), jnp.int32), eos_mask=jnp.zeros((V,), bool))


def test_python_loop_twin_gives_identical_outputs(stand_in):
    options = dl.DecodeOptions(eos_ids=5, stop_sequences=[[20, 21]], return_top_logprobs=3)
    prompts = [[1], [17, 18], [25, 26, 27]]
    compiled = run(stand_in, prompts, 6, options=options)
    twin = run(stand_in, prompts, 6, options=dataclasses.replace(options, python_loop=True))
    np.testing.assert_array_equal(twin.tokens, compiled.tokens)
    assert twin.finish_reason == compiled.finish_reason == ["eos", "stop", "length"]
    np.testing.assert_array_equal(twin.top_logprobs, compiled.top_logprobs)


def test_first_token_distribution_over_many_requests_matches_the_model():
    """Chi-square at significance 1e-3: 2000 requests (rows 0..1999 under seed 0, each its own
    stream) of one prompt draw their first token from softmax(base); the stand-in's margin is 0
    so base is the whole distribution."""
    base = np.log(np.r_[np.full(4, 0.2), np.full(4, 0.05), np.zeros(V - 8)] + 1e-30)
    model = NextToken(margin=0.0, base=base)
    out = run(model, [[0]] * 2000, 1, dl.SamplingParams(), seed=0)
    counts = np.bincount(out.tokens[:, 0], minlength=V)
    assert counts[8:].sum() == 0
    expected = np.r_[np.full(4, 0.2), np.full(4, 0.05)] * 2000
    assert scipy.stats.chisquare(counts[:8], expected).pvalue > 1e-3


# --- Broken model, impossible constraints ---------------------------------------------------------


def test_nan_logits_are_never_sampled_and_raise_by_default():
    model = NextToken(nan_token=20)
    with pytest.raises(ValueError, match=r"row 0 after 2 tokens: the model's logits hold NaN"):
        run(model, [[17], [1]], 4)
    out = run(model, [[17], [1]], 4, options=dl.DecodeOptions(raise_on_error=False))
    assert out.token_lists() == [[18, 19], [2, 3, 4, 5]]
    assert out.finish_reason == ["error", "length"]


def test_parameters_that_leave_no_token_finish_with_error():
    params = dl.SamplingParams(temperature=0.0, min_new_tokens=1,
                               banned_tokens=[i for i in range(V) if i != 7])
    with pytest.raises(ValueError, match=r"row 0 after 0 tokens: no token has a finite prob"):
        run(NextToken(), [[3]], 2, params, options=dl.DecodeOptions(eos_ids=7))


# --- The real Transformer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


PROMPTS = [[5, 17, 300, 2], [9], list(range(40, 60)), [7, 7]]  # row 2 alone is in bucket 32


def test_greedy_equals_argmax_of_full_forward_passes(tiny):
    """No cache: each step runs the whole sequence (padded at the end, which causal attention
    never lets earlier positions see) and takes the argmax at each row's last position."""
    out = run(tiny, PROMPTS, 6)
    graphdef, weights = nnx.split(tiny)
    forward = jax.jit(lambda w, tokens: nnx.merge(graphdef, w)(tokens))
    lengths = np.array([len(p) for p in PROMPTS])
    sequences = np.zeros((len(PROMPTS), lengths.max() + 6), np.int32)
    for row, prompt in enumerate(PROMPTS):
        sequences[row, :len(prompt)] = prompt
    for _ in range(6):
        logits = np.asarray(forward(weights, sequences))  # [B, T, V]
        sequences[np.arange(len(PROMPTS)), lengths] = np.argmax(
            logits[np.arange(len(PROMPTS)), lengths - 1], axis=-1)
        lengths += 1
    for row, prompt in enumerate(PROMPTS):
        assert out.token_lists()[row] == sequences[row, len(prompt):len(prompt) + 6].tolist()


def test_greedy_helper_keeps_its_contract(tiny):
    assert decode.greedy(tiny, PROMPTS, 6) == run(tiny, PROMPTS, 6).token_lists()


MIXED = dl.SamplingParams(
    temperature=[0.0, 0.9, 1.2, 0.7],
    top_k=[0, 40, 0, 0],
    top_p=[1.0, 0.95, 1.0, 0.9],
    min_p=[0.0, 0.0, 0.05, 0.0],
    repetition_penalty=[1.0, 1.3, 1.0, 1.0],
    presence_penalty=[0.0, 0.0, 0.5, 0.0],
    no_repeat_ngram_size=[0, 0, 0, 2],
)
SEEDS = [11, 12, 13, 14]
TOP_2 = dl.DecodeOptions(return_top_logprobs=2)


def _row(params: dl.SamplingParams, rows) -> dl.SamplingParams:
    """The per-row fields of ``params`` taken at ``rows``."""
    changes = {name: [getattr(params, name)[r] for r in rows]
               for name in dl.sampling.PARAMETERS if isinstance(getattr(params, name), list)}
    return params.replace(**changes)


@pytest.fixture(scope="module")
def mixed_batch(tiny):
    return run(tiny, PROMPTS, 8, MIXED, seed=SEEDS, options=TOP_2)


def test_python_loop_twin_matches_the_compiled_loop_on_the_transformer(tiny, mixed_batch):
    twin = run(tiny, PROMPTS, 8, MIXED, seed=SEEDS,
               options=dl.DecodeOptions(return_top_logprobs=2, python_loop=True))
    np.testing.assert_array_equal(twin.tokens, mixed_batch.tokens)
    np.testing.assert_allclose(twin.logprobs, mixed_batch.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("row", range(len(PROMPTS)))
def test_a_request_alone_equals_the_same_request_in_a_mixed_batch(tiny, mixed_batch, row):
    """Per-row parameters and per-request seeds: each row of the batch, greedy or sampled, is
    what the request gives alone (a different batch size, and for rows 0, 1 and 3 a different
    prompt bucket and cache size)."""
    alone = run(tiny, [PROMPTS[row]], 8, _row(MIXED, [row]), seed=[SEEDS[row]], options=TOP_2)
    np.testing.assert_array_equal(alone.tokens[0], mixed_batch.tokens[row])
    np.testing.assert_allclose(alone.logprobs[0], mixed_batch.logprobs[row], rtol=0, atol=1e-5)
    np.testing.assert_allclose(alone.top_logprobs[0], mixed_batch.top_logprobs[row], atol=1e-5)


def test_a_request_gives_the_same_tokens_at_every_position_of_a_batch(tiny, mixed_batch):
    """The needle (row 1, sampled) among other requests, moved through every position."""
    needle = 1
    others = [r for r in range(len(PROMPTS)) if r != needle]
    for position in range(len(PROMPTS)):
        order = others[:position] + [needle] + others[position:]
        out = run(tiny, [PROMPTS[r] for r in order], 8, _row(MIXED, order),
                  seed=[SEEDS[r] for r in order], options=TOP_2)
        np.testing.assert_array_equal(out.tokens[position], mixed_batch.tokens[needle])
        np.testing.assert_allclose(out.logprobs[position], mixed_batch.logprobs[needle], rtol=0,
                                   atol=1e-5)


# --- Compile once ---------------------------------------------------------------------------------


def test_a_sweep_of_sampling_values_and_processors_compiles_once(tiny):
    """The parameter values, which processors are enabled included, are array contents: a sweep
    of values, then top-k switched off, then greedy, compiles each program once; new prompt
    lengths within the bucket compile nothing, a new prompt bucket compiles the prefill once more
    (the counter does see a compile)."""
    rng = np.random.default_rng(0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]  # batch 2, bucket 16, 5 new tokens
    S = 37  # a cache size no other test uses, so the first call compiles (batches and output
    # widths are bucketed: another test's batch of 2 with a few new tokens shares its programs)
    with experiment.count_traces() as counts:
        for i in range(20):
            params = dl.SamplingParams(temperature=float(rng.uniform(0.1, 1.5)),
                                       top_k=int(rng.integers(1, 50)),
                                       top_p=[float(rng.uniform(0.1, 1.0)), 1.0],
                                       min_p=float(rng.uniform(0.01, 0.2)),
                                       repetition_penalty=float(rng.uniform(1.01, 1.5)))
            run(tiny, prompts, 5, params, seed=i,
                **opts(max_len=S, eos_ids=[int(rng.integers(0, 512))]))
        run(tiny, prompts, 5, params.replace(top_k=0), **opts(max_len=S))  # top-k off in every row
        run(tiny, prompts, 5, params.replace(top_k=7, top_p=[0.5, 1.0]), **opts(max_len=S))
        run(tiny, prompts, 5, GREEDY, **opts(max_len=S))
        run(tiny, prompts, 5, dl.SamplingParams(temperature=[0.0, 0.8], typical_p=[1.0, 0.5]),
            **opts(max_len=S))
        assert counts["_decode_loop"] == 1 and counts["prefill"] == 1
        # new lengths, same bucket of 16
        run(tiny, [[1] * 9, [2] * 16], 5, GREEDY, **opts(max_len=S))
        assert counts["_decode_loop"] == 1 and counts["prefill"] == 1
        # bucket 32: the counter sees a compile of the prefill;
        run(tiny, [[1] * 17, [2]], 5, GREEDY, **opts(max_len=S))
        # the loop's shapes depend on max_len, not on the prompt block
        assert counts["_decode_loop"] == 1 and counts["prefill"] == 2


# --- A vocabulary padded past the tokenizer's -----------------------------------------------------

PADDED, PIECES = 640, 600  # the model's vocabulary, its tokenizer's


@pytest.fixture(scope="module")
def padded():
    return padded_next_token(PADDED, PIECES)


def test_a_padded_vocabulary_is_masked_past_the_tokenizer_as_data(padded):
    """The padding's logits are the largest: without the tokenizer both rows pick padding; with
    it, the greedy row and the sampled row never do, in the same compiled program."""
    mixed = dl.SamplingParams(temperature=[0.0, 1.0])
    bare = run(padded, [[596], [596]], 6, mixed)
    assert (bare.tokens >= PIECES).all()
    with compiles.count_compiles() as counts:
        out = run(padded, [[596], [596]], 6, mixed, **opts(tokenizer=Pieces(PIECES)))
    assert sum(counts.values()) == 0
    # greedy: 597 598 599, then 600 is padding and every id below has logit 0: the lowest, 0
    assert out.tokens[0].tolist() == [597, 598, 599, 0, 1, 2]
    assert (out.tokens[1] < PIECES).all() and out.finish_reason == ["length"] * 2


def test_stop_strings_with_a_padded_vocabulary_decode_only_the_tokenizers_ids(padded):
    # 597 598 599 are "z a b", then (past the padding) 0 is "a": "ba" ends the row there; an
    # unmasked row would sample padding, which the tokenizer cannot decode
    out = run(padded, [[596]], 6, **opts(tokenizer=Pieces(PIECES), stop_strings=["ba"]))
    assert out.token_lists() == [[597, 598, 599, 0]] and out.finish_reason == ["stop"]


def test_a_sweep_of_budgets_and_batch_sizes_compiles_once_per_bucket():
    """max_new_tokens 1..64 (one row), then batch sizes 1..8 (one new token each), on a stand-in
    of its own vocabulary (no other test's program is reused): the output buffers and the batch
    are padded to buckets, so each program compiles once per bucket touched, widths 8, 16, 32,
    64 and rows 1, 2, 4, 8 with the one-row width-8 program shared: 7, not 72. Each output is
    cut back to its own rows and columns. (Not the 64 x 8 cross product: each axis is bucketed
    alone, and the cross product would cost minutes.)"""
    V = 29
    model = NextToken(vocab_size=V)
    with compiles.count_compiles() as counts:
        for n in range(1, 65):
            out = run(model, [[3]], n)
            assert out.tokens.tolist() == [[(4 + i) % V for i in range(n)]]
            assert out.finish_reason == ["length"]
        for b in range(1, 9):
            out = run(model, [[i] for i in range(b)], 1)
            assert out.tokens.tolist() == [[i + 1] for i in range(b)]
    assert counts["_decode_loop"] == 7 and counts["prefill"] == 7


def test_padding_rows_and_columns_change_no_row(tiny, mixed_batch):
    """Three of the mixed batch's requests with a budget of 5 run as 4 rows of 8 columns, the
    mixed batch's own shapes, so they reuse its programs; the padding is cut from the output and
    each row's tokens and log-probabilities are the unpadded batch's, for per-request seeds and
    for one seed (row r draws from fold_in(key(seed), r) whatever the padding)."""
    rows = [0, 1, 2]
    # The mixed batch's programs again: compiled anew if the worker dropped them since the
    # fixture ran (``compiles.release_near_map_limit``), otherwise read from the in-process cache.
    run(tiny, PROMPTS, 8, MIXED, seed=SEEDS, options=TOP_2)
    with compiles.count_compiles() as counts:
        out = run(tiny, PROMPTS[:3], 5, _row(MIXED, rows), seed=SEEDS[:3], options=TOP_2)
    assert counts["_decode_loop"] == 0 and counts["prefill"] == 0
    assert out.tokens.shape == (3, 5) and out.top_logprobs.shape == (3, 5, 2)
    np.testing.assert_array_equal(out.tokens, mixed_batch.tokens[:3, :5])
    np.testing.assert_allclose(out.logprobs, mixed_batch.logprobs[:3, :5], rtol=0, atol=1e-5)
    one_seed = run(tiny, PROMPTS, 8, MIXED, seed=5)
    padded = run(tiny, PROMPTS[:3], 5, _row(MIXED, rows), seed=5)
    np.testing.assert_array_equal(padded.tokens, one_seed.tokens[:3, :5])
    assert (padded.tokens != out.tokens).any()  # the seeds matter: this compares sampled rows


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kwargs, message", [
    (([], 4), {}, r"prompts is empty; give at least one prompt"),
    (([[1], []], 4), {}, r"prompts\[1\] is empty; it needs at least one token"),
    (([[1, 32]], 4), {}, r"prompts\[0\] holds token id 32 at index 1; ids must be in \[0, 32\)"),
    (([[-1]], 4), {}, r"prompts\[0\] holds token id -1 at index 0; ids must be in \[0, 32\)"),
    (([[1.5]], 4), {}, r"prompts\[0\] must hold int token ids"),
    (("hello", 4), {}, r"prompts must be a list of token-id lists, got str"),
    (([[1] * 6], 4), opts(max_len=6), r"prompts\[0\] has 6 tokens but max_len is 6"),
    (([[1]], 0), {}, r"max_new_tokens must be an int >= 1, got 0"),
    (([[1]], 2.0), {}, r"max_new_tokens must be an int >= 1, got 2.0"),
    (([[1]], 4), dict(seed=-1), r"seed must be an int in \[0, 2\*\*32 - 1\]"),
    (([[1], [2]], 4), dict(seed=[1]), r"seed has 1 values but there are 2 prompts"),
    (([[1]], 4), dict(seed=[1.5]), r"seed\[0\] must be an int in \[0, 2\*\*32\), got 1.5"),
    (([[1]], 4), opts(eos_ids=32), r"eos_ids must be token ids in \[0, 32\), got 32"),
    (([[1]], 4), opts(stop_sequences=[[]]), r"stop_sequences\[0\] is empty"),
    (([[1]], 4), opts(stop_sequences=[[40]]), r"stop_sequences\[0\] holds token id 40"),
    (([[1]], 4), opts(stop_strings=["x"]),
     r"stop_strings need a tokenizer .*, got tokenizer=None"),
    (([[1]], 4), opts(stop_strings=[""], tokenizer=Letters()), r"stop_strings must be non-empty"),
    (([[1]], 4), opts(return_top_logprobs=-1),
     r"return_top_logprobs must be an int >= 0, got -1"),
    (([[1]], 4), opts(return_top_logprobs=33), r"return_top_logprobs must be <= the vocabulary"),
    (([[1]], 4), opts(return_entropy=1), r"return_entropy must be a bool, got 1"),
    (([[1]], 4), opts(python_loop=1), r"python_loop must be a bool, got 1"),
    (([[1]], 4), opts(raise_on_error=None), r"raise_on_error must be a bool, got None"),
    (([[1]], 4), dict(options={"eos_ids": 2}),
     r"options must be a DecodeOptions, got \{'eos_ids': 2\}"),
    (([[1]], 4), opts(max_len=1), r"max_len must be an int >= 2, got 1"),
    (([[1], [2], [3]], 4), dict(params=dl.SamplingParams(temperature=[0.5, 1.0])),
     r"temperature has 2 values but the batch has 3 rows"),
    (([[1]], 4), dict(params={"temperature": 0.5}), r"params must be a SamplingParams"),
    (([[1]], 4), opts(tokenizer=Pieces(33)),
     r"tokenizer has 33 ids but the model's vocabulary has 32; a tokenizer must have at most"),
    (([[1]], 4), dict(params=dl.SamplingParams(banned_tokens=[0, 1]), **opts(tokenizer=Pieces(2))),
     r"banned_tokens bans all 2 tokens of row 0 \(ids from 2 are padding\)"),
])
def test_bad_input_is_rejected_before_anything_is_traced(stand_in, args, kwargs, message):
    params = kwargs.pop("params", GREEDY)
    with experiment.count_traces() as counts, pytest.raises(ValueError, match=message):
        dl.generate(stand_in, args[0], params, args[1], **kwargs)
    assert not counts


def test_prompt_or_cache_longer_than_the_position_table_is_rejected(tiny_config):
    model = dl.Transformer(tiny_config.replace(position="learned"), rngs=nnx.Rngs(0))
    with experiment.count_traces() as counts:
        with pytest.raises(ValueError, match=r"prompts\[0\] has 64 tokens but max_len \(default: "
                                             r".*capped by the position table\) is 64"):
            run(model, [[1] * 64], 4)
        with pytest.raises(ValueError, match=r"max_len must be <= 64, the model's position table "
                                             r"\(max_seq_len\), got 65"):
            run(model, [[1]], 4, **opts(max_len=65))
    assert not counts


def test_rows_stop_at_the_position_table_by_default(tiny_config):
    model = dl.Transformer(tiny_config.replace(position="learned"), rngs=nnx.Rngs(0))
    out = run(model, [[1] * 60, [2]], 8)  # default max_len: min(64 + 8, 64)
    np.testing.assert_array_equal(out.lengths, [4, 8])
    assert out.finish_reason == ["length", "length"]
