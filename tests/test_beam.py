"""beam_search(): hand-computed beams on a stand-in chain model (including a case where greedy and
beam search disagree, and EOS with the length penalty), a plain-Python reference on random chains,
exhaustive search where the beam is wide enough, the real Transformer's own scores, batch
invariance, compile counting and bad input.

The stand-in (``standins.Chain``) is a second-order Markov chain with the Transformer's call
signature over a real KVCache: its next-token log-probabilities are ``log table[t2, t1]`` where
``t1`` and ``t2`` are the last two tokens read back from the cache row (a one-token history reads
``t1`` twice). Reading the history from the cache exposes any error in the per-beam reordering of
cache rows.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import DISAGREE, Chain, Pieces, chain_logp, padded_next_token

import decodelab as dl
from decodelab import experiment
from decodelab.decode import beam


def gnmt(n, alpha):
    return ((5 + n) / 6) ** alpha


def test_kv_cache_take_rows_copies_keys_values_and_lengths_by_row():
    cfg = dl.ModelConfig(vocab_size=8, d_model=2, n_layers=2, n_heads=1, position="nope")
    cache = dl.KVCache.init(cfg, batch_size=3, max_len=4)
    marks = jnp.arange(3, dtype=jnp.float32)[None, :, None, None, None]  # row b holds b
    cache = cache.replace(k=cache.k + marks, v=cache.v - marks,
                          lengths=jnp.asarray([1, 2, 3], jnp.int32))
    taken = cache.take_rows(jnp.asarray([2, 0, 0, 1]))
    assert taken.k.shape == (2, 4, 1, 4, 2)  # [L, B, K, S, H]
    np.testing.assert_array_equal(taken.k[:, :, 0, 0, 0], [[2, 0, 0, 1]] * 2)
    np.testing.assert_array_equal(taken.v[:, :, 0, 0, 0], [[-2, 0, 0, -1]] * 2)
    np.testing.assert_array_equal(taken.lengths, [3, 1, 1, 2])


def test_beam_cache_take_rows_moves_the_slot_table_not_keys_and_values():
    cfg = dl.ModelConfig(vocab_size=8, d_model=2, n_layers=1, n_heads=1, position="nope")  # H = 2
    prompts = dl.KVCache.init(cfg, batch_size=2, max_len=4)
    block = jnp.broadcast_to(jnp.asarray([[1.0, 2.0], [11.0, 12.0]])[:, :, None, None],
                             (2, 2, 1, 2))  # [B, T, K, H]: prompt b's tokens
    prompts = prompts.write(0, block, -block).advance(jnp.asarray([2, 2]))
    cache = beam.BeamCache.from_prompts(prompts, 2)  # rows 0, 1: prompt 0; rows 2, 3: prompt 1
    step = jnp.broadcast_to(jnp.asarray([3.0, 4.0, 13.0, 14.0])[:, None, None, None], (4, 1, 1, 2))
    cache = cache.write(0, step, -step).advance(jnp.ones((4,), jnp.int32))
    # Each beam's row starts as its prompt's row, then holds what it generated.
    np.testing.assert_array_equal(cache.store.k[0, :, 0, :3, 0],
                                  [[1, 2, 3], [1, 2, 4], [11, 12, 13], [11, 12, 14]])
    taken = cache.take_rows(jnp.asarray([1, 1, 3, 2]))
    assert taken.store.k is cache.store.k and taken.store.v is cache.store.v
    k, v = taken.read(0, 0, 3)  # [B, K, 3, H]
    expected = [[1, 2, 4], [1, 2, 4], [11, 12, 14], [11, 12, 13]]
    np.testing.assert_array_equal(k[:, 0, :, 0], expected)
    np.testing.assert_array_equal(v[:, 0, :, 1], -np.asarray(expected))
    np.testing.assert_array_equal(taken.lengths, [3, 3, 3, 3])


# --- Hand-computed beams --------------------------------------------------------------------------

V = 8  # standins.DISAGREE: greedy and beam search disagree


@pytest.fixture(scope="module")
def disagree():
    return Chain(DISAGREE)


def test_greedy_and_beam_search_disagree_where_the_best_path_starts_second_best(disagree):
    greedy = dl.generate(disagree, [[0], [2]], dl.SamplingParams.greedy(), 2)
    assert greedy.token_lists()[0] == [1, 6]
    out = dl.beam_search(disagree, [[0], [2]], width=2, max_new_tokens=2)
    assert out.token_lists()[0] == [[2, 3], [1, 6]]
    expected = np.log([DISAGREE[0, 2] * DISAGREE[2, 3], DISAGREE[0, 1] * DISAGREE[1, 6]])
    np.testing.assert_allclose(out.logprobs[0], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out.scores, out.logprobs, rtol=0, atol=0)  # alpha 0
    assert out.finish_reason[0] == ["length", "length"]


def test_width_one_is_greedy(disagree):
    out = dl.beam_search(disagree, [[0], [2]], width=1, max_new_tokens=2)
    greedy = dl.generate(disagree, [[0], [2]], dl.SamplingParams.greedy(), 2)
    assert out.best() == greedy.token_lists()


# EOS = 7. After 0: A=1 (0.6) or B=2 (0.4). After A: EOS (0.9) or 4 (0.1); after 4 always EOS.
# After B: 3, and after 3 always 3. With 4 new tokens the candidates are
#   [1, 7]        log 0.54, length 2 (eos)
#   [1, 4, 7]     log 0.06, length 3 (eos)
#   [2, 3, 3, 3]  log 0.40, length 4 (budget)
EOS = 7
ENDS = np.zeros((V, V))
ENDS[0, [1, 2]] = [0.6, 0.4]
ENDS[1, [EOS, 4]] = [0.9, 0.1]
ENDS[4, EOS] = 1.0
ENDS[2, 3] = ENDS[3, 3] = 1.0
ENDS[[5, 6, 7], 0] = 1.0
HYPOTHESES = {(1, 7): (math.log(0.54), 2, "eos"), (1, 4, 7): (math.log(0.06), 3, "eos"),
              (2, 3, 3, 3): (math.log(0.4), 4, "length")}


@pytest.fixture(scope="module")
def ends():
    return Chain(ENDS)


@pytest.mark.parametrize("alpha, order", [(0.0, [(1, 7), (2, 3, 3, 3)]),
                                          (2.0, [(2, 3, 3, 3), (1, 7)])])
def test_finished_hypotheses_are_kept_and_the_length_penalty_ranks_them(ends, alpha, order):
    """A hypothesis that ends with EOS at step 2 stays in the n-best while the other beam runs on
    to the budget; alpha 0 prefers the short one, alpha 2 the long one (-0.616 / (7/6)^2 = -0.453
    < -0.916 / (9/6)^2 = -0.407). Prompts 0 and 1 end with the same token (ragged prompts each
    continue from their own history); after prompt 2's [3, 2] only 3 follows, so it has one
    hypothesis and the second slot is empty."""
    out = dl.beam_search(ends, [[0], [5, 6, 0], [3, 2]], width=2, max_new_tokens=4,
                         length_penalty=alpha, options=dl.BeamOptions(eos_ids=EOS))
    logprob, length, reason = zip(*(HYPOTHESES[h] for h in order))
    for p in (0, 1):
        assert [tuple(h) for h in out.token_lists()[p]] == order
        np.testing.assert_allclose(out.logprobs[p], logprob, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(out.lengths[p], length)
        np.testing.assert_allclose(out.scores[p], np.array(logprob) / gnmt(np.array(length), alpha),
                                   rtol=1e-6)
        assert out.finish_reason[p] == list(reason)
    assert out.tokens[0, 0, out.lengths[0, 0]:].tolist() == [-1] * (4 - out.lengths[0, 0])
    assert out.token_lists()[2] == [[3, 3, 3, 3], []]
    np.testing.assert_array_equal(out.logprobs[2], [0.0, -np.inf])
    assert out.finish_reason[2] == ["length", "none"]


def test_min_new_tokens_keeps_eos_from_ending_shorter_hypotheses(ends):
    """With at least 3 tokens [1, 7] may not finish; [1, 4, 7] may, and is now second."""
    out = dl.beam_search(ends, [[0], [5, 6, 0], [3, 2]], width=2, max_new_tokens=4,
                         options=dl.BeamOptions(eos_ids=EOS, min_new_tokens=3))
    assert out.token_lists()[0] == [[2, 3, 3, 3], [1, 4, 7]]
    np.testing.assert_allclose(out.logprobs[0], np.log([0.4, 0.06]), rtol=0, atol=1e-6)


# --- A plain-Python reference on random second-order chains ---------------------------------------


def reference_beam_search(table, prompt, width, budget, alpha, eos):
    """The documented algorithm, one hypothesis at a time: the ``width`` best EOS extensions enter
    a pool of the ``width`` best finished hypotheses, the ``width`` best other extensions run on,
    and at the budget the running beams join the pool. No early stop."""
    running, pool = [((), 0.0)], []
    for n in range(1, budget + 1):
        extended = [(out + (t,), lp + chain_logp(table, list(prompt) + list(out))[t])
                    for out, lp in running for t in range(len(table))]
        ended = sorted([c for c in extended if c[0][-1] in eos], key=lambda c: -c[1])[:width]
        running = sorted([c for c in extended if c[0][-1] not in eos], key=lambda c: -c[1])[:width]
        pool += [(out, lp, lp / gnmt(n, alpha), "eos") for out, lp in ended]
        if n == budget:
            pool += [(out, lp, lp / gnmt(n, alpha), "length") for out, lp in running]
        pool = sorted(pool, key=lambda h: -h[2])[:width]
    return pool


def tied_groups(hypotheses, scores):
    """Hypotheses in rank order, those of equal score (to 1e-5) as one set: a chain gives two
    outputs that visit the same transitions in another order exactly the same probability."""
    groups, last = [], None
    for h, score in zip(hypotheses, scores):
        if last is None or abs(score - last) > 1e-5:
            groups.append(set())
        groups[-1].add(tuple(h))
        last = score
    return groups


@pytest.mark.parametrize("seed, alpha, kv_cache",
                         [(0, 0.0, None), (1, 0.6, None), (2, 1.5, None), (4, 0.6, None),
                          (1, 0.6, "int8")])
def test_matches_the_reference_on_random_chains_with_eos(seed, alpha, kv_cache):
    """With ``kv_cache="int8"`` the chain's token ids (one channel, a scale per token) come back
    from the quantized beam cache to within rounding, so the reordering is checked there too."""
    rng = np.random.default_rng(seed)
    Vr, eos = 6, (4, 5)
    table = rng.dirichlet(np.full(Vr, 0.5), size=(Vr, Vr))  # [V, V, V]
    table[:, :, list(eos)] *= 0.3  # finishing is possible, not the rule
    table /= table.sum(axis=-1, keepdims=True)
    model = Chain(table)
    prompts = [[0], [1, 2], [3, 0, 1]]
    out = dl.beam_search(model, prompts, width=3, max_new_tokens=5, length_penalty=alpha,
                         kv_cache=kv_cache, options=dl.BeamOptions(eos_ids=list(eos)))
    for p, prompt in enumerate(prompts):
        expected = reference_beam_search(table, prompt, 3, 5, alpha, eos)
        assert tied_groups(out.token_lists()[p], out.scores[p]) == tied_groups(
            [h[0] for h in expected], [h[2] for h in expected])
        np.testing.assert_allclose(out.logprobs[p], [h[1] for h in expected], rtol=0, atol=1e-5)
        np.testing.assert_allclose(out.scores[p], [h[2] for h in expected], rtol=0, atol=1e-5)
        assert out.finish_reason[p] == [h[3] for h in expected]


def test_a_beam_as_wide_as_the_vocabulary_finds_the_exhaustive_n_best_of_two_tokens():
    rng = np.random.default_rng(7)
    Vr = 5
    table = rng.dirichlet(np.ones(Vr), size=(Vr, Vr))
    out = dl.beam_search(Chain(table), [[2]], width=Vr, max_new_tokens=2)
    every = {(a, b): chain_logp(table, [2])[a] + chain_logp(table, [2, a])[b]
             for a, b in itertools.product(range(Vr), repeat=2)}
    best = sorted(every, key=lambda k: -every[k])[:Vr]
    assert [tuple(h) for h in out.token_lists()[0]] == best
    np.testing.assert_allclose(out.logprobs[0], [every[k] for k in best], rtol=0, atol=1e-5)


def test_python_loop_twin_gives_identical_hypotheses():
    table = np.random.default_rng(5).dirichlet(np.ones(6), size=(6, 6))
    kwargs = dict(width=3, max_new_tokens=5, length_penalty=0.6)
    prompts = [[0], [1, 2], [3, 0, 1]]
    compiled = dl.beam_search(Chain(table), prompts, **kwargs,
                              options=dl.BeamOptions(eos_ids=[4, 5]))
    twin = dl.beam_search(Chain(table), prompts, **kwargs,
                          options=dl.BeamOptions(eos_ids=[4, 5], python_loop=True))
    assert twin.token_lists() == compiled.token_lists()
    np.testing.assert_array_equal(twin.scores, compiled.scores)


def test_nan_logits_raise():
    table = np.zeros((4, 4))
    table[1] = np.nan
    table[2, 3] = table[3, 2] = table[0, 1] = 1.0  # prompt [2] never reaches token 1
    with pytest.raises(ValueError, match=r"beam search failed for prompts \[0\]: .* NaN"):
        dl.beam_search(Chain(table), [[0], [2]], width=2, max_new_tokens=2)


# --- The real Transformer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


PROMPTS = [[5, 17, 300, 2], [9], list(range(40, 60))]  # row 2 alone is in bucket 32


@pytest.fixture(scope="module")
def tiny_beams(tiny):
    return dl.beam_search(tiny, PROMPTS, width=4, max_new_tokens=6, length_penalty=0.6,
                          options=dl.BeamOptions(eos_ids=[3, 7]))


def test_each_hypothesis_scores_its_own_tokens_under_a_full_forward_pass(tiny, tiny_beams):
    """No cache: the model reads prompt + hypothesis at once (padded at the end, which causal
    attention never lets earlier positions see); the sum of its log-probabilities of the hypothesis
    tokens is the returned log-probability, so every beam was given its parent's cache row."""
    pairs = [(prompt, h) for p, prompt in enumerate(PROMPTS) for h in tiny_beams.token_lists()[p]]
    sequences = np.zeros((len(pairs), 32), np.int32)
    for i, (prompt, h) in enumerate(pairs):
        sequences[i, :len(prompt) + len(h)] = prompt + h
    graphdef, weights = nnx.split(tiny)
    forward = jax.jit(lambda w, t: jax.nn.log_softmax(nnx.merge(graphdef, w)(t), axis=-1))
    logp = np.asarray(forward(weights, jnp.asarray(sequences)))  # [B, T, V]
    expected = [sum(logp[i, len(prompt) - 1 + j, t] for j, t in enumerate(h))
                for i, (prompt, h) in enumerate(pairs)]
    np.testing.assert_allclose(tiny_beams.logprobs.reshape(-1), expected, rtol=0, atol=1e-4)
    for p in range(len(PROMPTS)):
        assert len({tuple(h) for h in tiny_beams.token_lists()[p]}) == 4
        assert np.all(np.diff(tiny_beams.scores[p]) <= 0)


def test_a_prompt_gives_the_same_hypotheses_at_every_position_of_the_batch(tiny, tiny_beams):
    order = [2, 0, 1]
    moved = dl.beam_search(tiny, [PROMPTS[p] for p in order], width=4, max_new_tokens=6,
                           length_penalty=0.6, options=dl.BeamOptions(eos_ids=[3, 7]))
    for position, p in enumerate(order):
        assert moved.token_lists()[position] == tiny_beams.token_lists()[p]
        np.testing.assert_allclose(moved.scores[position], tiny_beams.scores[p], rtol=0, atol=1e-5)




def test_an_int8_cache_beam_of_width_one_is_int8_greedy_decoding(tiny):
    """The int8 cache is read through the beam cache's slot table exactly as ``generate`` reads
    it directly: the same per-token scales, so the same tokens."""
    out = dl.beam_search(tiny, PROMPTS, width=1, max_new_tokens=6, kv_cache="int8")
    greedy = dl.generate(tiny, PROMPTS, dl.SamplingParams.greedy(), 6, kv_cache="int8")
    assert out.best() == greedy.token_lists()


def test_length_penalties_eos_ids_and_prompt_lengths_compile_once(ends):
    with experiment.count_traces() as counts:
        for i, alpha in enumerate([0.0, 0.6, 1.0, 2.5]):
            dl.beam_search(ends, [[1] * (i + 1), [2, 3]], width=3, max_new_tokens=5,
                           length_penalty=alpha, options=dl.BeamOptions(eos_ids=[i]))
        assert counts["_beam_loop"] == 1 and counts["beam_prefill"] == 1


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(width=0), r"width must be an int >= 1, got 0"),
    (dict(width=2.0), r"width must be an int >= 1, got 2.0"),
    (dict(width=9), r"width must be <= the vocabulary size 8, got 9"),
    (dict(length_penalty=-0.5), r"length_penalty must be a finite number in \[0, 4\], got -0.5"),
    (dict(length_penalty=float("nan")), r"length_penalty must be a finite number in \[0, 4\]"),
    (dict(length_penalty="0.6"), r"length_penalty must be a finite number in .*, got '0.6'"),
    (dict(length_penalty=4.5), r"length_penalty must be a finite number in \[0, 4\], got 4.5"),
    (dict(options=dl.BeamOptions(num_return=3)),
     r"num_return must be an int in \[1, width=2\], got 3"),
    (dict(options=dl.BeamOptions(num_return=0)),
     r"num_return must be an int in \[1, width=2\], got 0"),
    (dict(max_new_tokens=0), r"max_new_tokens must be an int >= 1, got 0"),
    (dict(options=dl.BeamOptions(min_new_tokens=-1)),
     r"min_new_tokens must be an int >= 0, got -1"),
    (dict(options=dl.BeamOptions(python_loop="yes")), r"python_loop must be a bool, got 'yes'"),
    (dict(options={"num_return": 1}), r"options must be a BeamOptions, got \{'num_return': 1\}"),
    (dict(prompts=[[1], []]), r"prompts\[1\] is empty"),
    (dict(prompts=[[8]]), r"prompts\[0\] holds token id 8 at index 0; ids must be in \[0, 8\)"),
    (dict(options=dl.BeamOptions(eos_ids=[9])), r"eos_ids must be token ids in \[0, 8\), got 9"),
    (dict(max_len=4, prompts=[[1] * 4]), r"prompts\[0\] has 4 tokens but max_len is 4"),
    (dict(kv_cache="int3"), r"kv_cache must be None \(float\) or one of \('int8', 'int4'\), got "
                            r"'int3'"),
    (dict(kv_cache="int4"), r"kv_cache must be None or 'int8' for beam search, got 'int4'"),
])
def test_bad_input_is_rejected_before_anything_is_traced(disagree, kwargs, message):
    args = dict(prompts=[[0]], width=2, max_new_tokens=3) | kwargs
    with experiment.count_traces() as counts, pytest.raises(ValueError, match=message):
        dl.beam_search(disagree, args.pop("prompts"), **args)
    assert not counts


def test_a_padded_vocabulary_is_never_taken_with_its_tokenizer():
    """The padding's logits are the largest: without the tokenizer every beam takes padding;
    with it none does, the log-probabilities are over the tokenizer's ids, and a beam wider than
    the tokenizer is refused."""
    padded = padded_next_token(40, 30)
    bare = dl.beam_search(padded, [[26]], 2, 4)
    assert (bare.tokens[0, 0] >= 30).all()
    out = dl.beam_search(padded, [[26]], 2, 4, options=dl.BeamOptions(tokenizer=Pieces(30)))
    assert (out.tokens[0] < 30).all() and out.tokens[0, 0].tolist() == [27, 28, 29, 0]
    assert np.isfinite(out.logprobs[0]).all()
    with pytest.raises(ValueError, match="width must be <= the tokenizer's size 30, got 31"):
        dl.beam_search(padded, [[26]], 31, 4, options=dl.BeamOptions(tokenizer=Pieces(30)))
