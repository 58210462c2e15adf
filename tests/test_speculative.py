"""speculative_generate(): greedy parity with generate, exactness of the sampled distribution,
statistics against a direct count, and bad input.

Stand-in models (``standins.NextToken``, as in test_decode) make the greedy rounds exact: the
target's next token is ``last + 1``; the draft's is too, except after a token that is 4 mod 5,
where it proposes ``last + 2``. Tiny random Transformers check parity and, with a vocabulary of 8, the distribution of
the first two output tokens against the exact one computed from the target's logits.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx
from standins import FakeTokenizer, Letters, NextToken, Pieces, padded_next_token

import decodelab as dl
from decodelab import experiment
from decodelab.decode.request import OutputSpec, RowInputs
from decodelab.sampling import mirostat
from decodelab.speculative import generation as speculative
from decodelab.speculative import rounds as spec_round
from decodelab.speculative.generation import NgramDrafter, SpeculativeOptions

GREEDY = dl.SamplingParams.greedy()
V = 32


# --- Rounds and statistics, exactly ---------------------------------------------------------------


def simulate_greedy(prompt, gamma, max_new_tokens, target_next, draft_next, eos, stop):
    """The algorithm in plain Python for deterministic models: the output, the number of accepted
    proposals of each round, and the proposals tested and accepted at each draft position."""
    seq, rounds = list(prompt), []
    tested, accepted = np.zeros(gamma, int), np.zeros(gamma, int)
    while len(seq) - len(prompt) < max_new_tokens:
        proposals, x = [], seq[-1]
        for _ in range(gamma):
            x = draft_next(x)
            proposals.append(x)
        n, x = 0, seq[-1]
        for d in proposals:
            tested[n] += 1
            if d != target_next(x):
                break
            accepted[n] += 1
            n, x = n + 1, d
        rounds.append(n)
        for token in (proposals[:n] + [target_next(x)])[:max_new_tokens - (len(seq) - len(prompt))]:
            seq.append(token)
            if token == eos or seq[-len(stop):] == stop and len(seq) - len(prompt) >= len(stop):
                return seq[len(prompt):], rounds, tested, accepted
    return seq[len(prompt):], rounds, tested, accepted


def test_rounds_and_statistics_equal_a_direct_count_of_the_algorithm():
    """The draft errs after every token 4 mod 5; row 0 ends at an EOS and row 1 at a stop
    sequence in the middle of a round, row 2 at the budget (its last round cut short)."""
    gamma, prompts, N = 3, [[0], [2, 10], [16]], 13
    out = speculative.speculative_generate(NextToken(), NextToken(skip_after=5), prompts, GREEDY,
                                           gamma, N, options=dl.DecodeOptions(
                                               eos_ids=9, stop_sequences=[[14, 15]]))
    assert out.finish_reason == ["eos", "stop", "length"]
    stats = out.stats
    tested, accepted = np.zeros(gamma, int), np.zeros(gamma, int)
    for row, prompt in enumerate(prompts):
        expected, rounds, row_tested, row_accepted = simulate_greedy(
            prompt, gamma, N, lambda t: (t + 1) % V,
            lambda t: (t + (2 if t % 5 == 4 else 1)) % V, eos=9, stop=[14, 15])
        assert out.token_lists()[row] == expected
        assert stats.rounds[row] == len(rounds)
        assert stats.accepted_per_round[row, :len(rounds)].tolist() == rounds
        np.testing.assert_array_equal(stats.tested_by_position[row], row_tested)
        np.testing.assert_array_equal(stats.accepted_by_position[row], row_accepted)
        assert stats.alpha[row] == row_accepted.sum() / row_tested.sum()
        assert stats.tokens_per_call[row] == len(expected) / len(rounds)
        tested, accepted = tested + row_tested, accepted + row_accepted
    assert 0 < stats.overall_alpha == accepted.sum() / tested.sum() < 1
    np.testing.assert_array_equal(stats.acceptance_by_position, accepted / tested)
    assert stats.overall_tokens_per_call == out.lengths.sum() / stats.rounds.sum()
    check_counts_agree_with_the_rounds(stats, out.lengths)


def check_counts_agree_with_the_rounds(stats, lengths):
    """The counters against the per-round record: round r of a row accepted n_r proposals, so
    position j was tested in the rounds with n_r >= j and accepted in those with n_r > j (every
    proposal is tested while the earlier ones are accepted), and the row output n_r + 1 tokens a
    round but for the last, which the budget may cut."""
    for row in range(len(lengths)):
        record = stats.accepted_per_round[row]
        n = record[record >= 0]
        assert len(n) == stats.rounds[row] and (record[len(n):] == -1).all()
        j = np.arange(stats.gamma)[:, None]
        np.testing.assert_array_equal(stats.tested_by_position[row], (n[None] >= j).sum(axis=1))
        np.testing.assert_array_equal(stats.accepted_by_position[row], (n[None] > j).sum(axis=1))
        assert (n[:-1] + 1).sum() < lengths[row] <= (n + 1).sum()


def test_theory_formulas():
    np.testing.assert_allclose(speculative.expected_tokens_per_call(0.5, 3), 1.875)
    assert speculative.expected_tokens_per_call(1.0, 3) == 4.0
    assert speculative.expected_tokens_per_call(0.0, 3) == 1.0
    np.testing.assert_allclose(speculative.predicted_speedup(0.5, 3, 0.25), 1.875 / 1.75)


# --- The real Transformer: greedy parity ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tiny_draft(tiny_config):
    """An untrained draft, smaller than the target: it rarely agrees with it."""
    cfg = tiny_config.replace(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    return dl.Transformer(cfg, rngs=nnx.Rngs(1))


PROMPTS = [[5, 17, 300, 2], [9], list(range(40, 60)), [7, 7]]  # ragged; row 2 alone in bucket 32


@pytest.fixture(scope="module")
def greedy_reference(tiny):
    return dl.generate(tiny, PROMPTS, GREEDY, 16)


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_greedy_equals_greedy_generate_with_a_random_draft(tiny, tiny_draft, greedy_reference,
                                                           gamma):
    out = speculative.speculative_generate(tiny, tiny_draft, PROMPTS, GREEDY, gamma, 16,
                                           options=SpeculativeOptions(max_len=48))
    # (max_len fixed: one prefill program for all gammas)
    assert out.token_lists() == greedy_reference.token_lists()
    assert out.finish_reason == greedy_reference.finish_reason
    np.testing.assert_array_equal(out.logprobs, greedy_reference.logprobs)
    assert 0.0 <= out.stats.overall_alpha < 1.0
    check_counts_agree_with_the_rounds(out.stats, out.lengths)


def test_greedy_with_the_target_as_its_own_draft_accepts_everything(tiny, greedy_reference):
    out = speculative.speculative_generate(tiny, tiny, PROMPTS, GREEDY, 3, 16)
    assert out.token_lists() == greedy_reference.token_lists()
    assert out.stats.overall_alpha == 1.0
    assert out.stats.rounds.tolist() == [4] * 4  # 16 tokens, 3 + 1 per round
    check_counts_agree_with_the_rounds(out.stats, out.lengths)


def test_greedy_with_ngram_drafts_equals_greedy_generate(tiny, greedy_reference):
    out = speculative.speculative_generate(tiny, NgramDrafter(), PROMPTS, GREEDY, 3, 16)
    assert out.token_lists() == greedy_reference.token_lists()


@pytest.fixture(scope="module")
def dynamic_rope(tiny_config):
    """Dynamic NTK RoPE with an original context of 8: PROMPTS and their outputs run past it."""
    cfg = tiny_config.replace(position="rope", rope_scaling="dynamic", rope_scaling_factor=4.0,
                              rope_original_max_len=8)
    return dl.Transformer(cfg, rngs=nnx.Rngs(0))


def test_dynamic_rope_past_the_original_context_stays_exact(dynamic_rope, tiny_draft):
    """Each token is rotated by its own position, so a verify block scores every position as a
    full forward does: each sampled token's reported logprob is the target's full-forward
    log-probability there (with per-pass extents the rows reaching past 8 would differ)."""
    out = speculative.speculative_generate(dynamic_rope, tiny_draft, PROMPTS, dl.SamplingParams(),
                                           3, 16, seed=0)
    assert out.stats.overall_alpha < 1.0  # some proposals were rejected and re-drawn
    sequences = [prompt + tokens for prompt, tokens in zip(PROMPTS, out.token_lists())]
    T = max(len(s) for s in sequences)
    block = np.zeros((len(sequences), T), np.int32)  # padding after a row: causal, so unseen
    for b, s in enumerate(sequences):
        block[b, :len(s)] = s
    logp = np.asarray(jax.nn.log_softmax(dynamic_rope(jnp.asarray(block)), axis=-1))  # [B, T, V]
    for b, (prompt, tokens) in enumerate(zip(PROMPTS, out.token_lists())):
        expected = [logp[b, len(prompt) - 1 + i, t] for i, t in enumerate(tokens)]
        np.testing.assert_allclose(out.logprobs[b, :len(tokens)], expected, rtol=0, atol=1e-5,
                                   err_msg=f"row {b}")


def ngram_proposal(prompt, gamma=3):
    """``(tokens, count)`` that ``NgramDrafter()`` proposes after ``prompt`` (one row)."""
    graphdef, weights = nnx.split(NextToken())
    block = np.zeros((1, 16), np.int32)
    block[0, :len(prompt)] = prompt
    lengths = np.asarray([len(prompt)], np.int32)
    caches = speculative.prefill(weights, None, block, lengths - 1, graphdef=graphdef,
                                 drafter=NgramDrafter(), max_len=32)
    rows = RowInputs(prompt_lengths=lengths, keys=dl.sampling.seed_keys(np.zeros((1,), np.uint32)),
                     params=GREEDY.per_row(1, V), eos_mask=np.zeros((V,), bool),
                     stop_ids=np.zeros((0, 1), np.int32))
    state = speculative.initial_state(*caches, block, rows, gamma=gamma, outputs=OutputSpec(8))
    proposal, _ = NgramDrafter().propose(None, state)
    return proposal.tokens[0].tolist(), int(proposal.count[0])


def test_ngram_drafter_proposes_what_followed_the_latest_match_of_the_longest_ngram():
    # "3 4" ends the context; of its earlier occurrences the latest is followed by 9 8 1
    # (a 3-gram "2 3 4" would win, but "1 3 4" occurs nowhere earlier).
    assert ngram_proposal([3, 4, 7, 7, 3, 4, 9, 8, 1, 1, 3, 4]) == ([9, 8, 1], 3)
    # the longest n-gram wins over a later shorter match: "5 6 7" -> 1 2 3, not "7" -> 0
    assert ngram_proposal([5, 6, 7, 1, 2, 3, 7, 0, 5, 6, 7]) == ([1, 2, 3], 3)
    # a repeat closer than gamma is continued periodically: ... 5 6 5 6 -> 5 6 5
    assert ngram_proposal([1, 5, 6, 5, 6]) == ([5, 6, 5], 3)
    assert ngram_proposal([1, 2, 3])[1] == 0  # no earlier occurrence of anything


# --- Sampling: per-request randomness ------------------------------------------------------------

MIXED = dl.SamplingParams(temperature=[0.0, 0.9, 1.2, 0.7], top_k=[0, 40, 0, 0],
                          top_p=[1.0, 0.95, 1.0, 0.9], repetition_penalty=[1.0, 1.3, 1.0, 1.0])
SEEDS = [11, 12, 13, 14]


def _rows(params, order):
    return params.replace(**{name: [getattr(params, name)[r] for r in order]
                             for name in ("temperature", "top_k", "top_p", "repetition_penalty")})


def test_a_sampled_request_gives_the_same_output_at_every_position_of_a_batch(tiny, tiny_draft):
    """Per-request keys: the batch reversed (so each request has other neighbours and another
    row) gives each request the same tokens; so does the Python-loop twin."""
    options = SpeculativeOptions(return_top_logprobs=2, return_entropy=True)
    batch = speculative.speculative_generate(tiny, tiny_draft, PROMPTS, MIXED, 3, 10, seed=SEEDS,
                                             options=options)
    order = [3, 2, 1, 0]
    moved = speculative.speculative_generate(tiny, tiny_draft, [PROMPTS[r] for r in order],
                                             _rows(MIXED, order), 3, 10,
                                             seed=[SEEDS[r] for r in order], options=options)
    np.testing.assert_array_equal(moved.tokens[::-1], batch.tokens)
    np.testing.assert_allclose(moved.logprobs[::-1], batch.logprobs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(moved.entropy[::-1], batch.entropy, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(moved.stats.rounds[::-1], batch.stats.rounds)
    twin = speculative.speculative_generate(tiny, tiny_draft, PROMPTS, MIXED, 3, 10, seed=SEEDS,
                                            options=dataclasses.replace(options, python_loop=True))
    np.testing.assert_array_equal(twin.tokens, batch.tokens)
    np.testing.assert_array_equal(twin.stats.accepted_per_round, batch.stats.accepted_per_round)


# --- Sampling: exactly the target's distribution --------------------------------------------------

SMALL_V = 8
SAMPLES = 20_000
SIGNIFICANCE = 1e-3  # a correct sampler fails a test with this probability


@pytest.fixture(scope="module")
def pair():
    """A target and a different draft over 8 tokens (random weights: far apart, total variation
    0.46 between their two-token distributions at temperature 1)."""
    cfg = dl.ModelConfig(vocab_size=SMALL_V, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                         max_seq_len=32)
    return dl.Transformer(cfg, rngs=nnx.Rngs(3)), dl.Transformer(cfg, rngs=nnx.Rngs(4))


def exact_two_token_distribution(target, prompt, params, eos_ids=(), allowed=None):
    """``[V, V]``: P(first two output tokens = (a, b)) under ``target`` with ``params``'
    processors (``eos_ids`` the ids min-new-tokens bans), from its logits:
    p(a | prompt) * p(b | prompt + a); ``allowed``: a constraint's ``[V]`` bool masks of the
    first and the second token, applied to the logits before the processors."""
    rows = np.asarray([prompt + [a] for a in range(SMALL_V)], np.int32)  # [V, P + 1]
    logits = target(jnp.asarray(rows))  # [V, P + 1, V], no cache
    P = len(prompt)
    eos_mask = jnp.zeros((SMALL_V,), bool).at[jnp.asarray(eos_ids, jnp.int32)].set(True)

    row_params = params.per_row(SMALL_V, SMALL_V)

    def processed(logits_at, lengths, tokens, mask=None, mu=None):
        if mask is not None:
            logits_at = jnp.where(jnp.asarray(mask), logits_at, -jnp.inf)
        history = dl.sampling.History(
            tokens=jnp.asarray(tokens), prompt_lengths=jnp.full((SMALL_V,), P, jnp.int32),
            lengths=jnp.asarray(lengths, jnp.int32), eos_mask=eos_mask, mirostat_mu=mu)
        return dl.sampling.processed_logprobs(logits_at, row_params, history)

    first_mask, second_mask = (None, None) if allowed is None else allowed
    first = processed(logits[:, P - 1], np.full(SMALL_V, P), rows, first_mask)[0]  # [V]
    # Mirostat's mu before the second token: moved by the first one's surprise.
    mu = mirostat.advanced_mu(mirostat.start_mu(row_params), first, row_params,
                              jnp.ones((SMALL_V,), bool))
    second = processed(logits[:, P], np.full(SMALL_V, P + 1), rows, second_mask, mu)  # [V, V]
    return np.exp(np.asarray(first, np.float64))[:, None] * np.exp(np.asarray(second, np.float64))


def first_two_tokens(target, draft, prompt, params, seed0, options=SpeculativeOptions()):
    out = speculative.speculative_generate(target, draft, [prompt] * SAMPLES, params, 2, 2,
                                           seed=seed0, options=options)
    assert (out.lengths == 2).all()
    return np.bincount(out.tokens[:, 0] * SMALL_V + out.tokens[:, 1],
                       minlength=SMALL_V * SMALL_V), out.stats


def chi_square_pvalue(counts, probabilities):
    """Pearson's test over the cells with expected count >= 5 (the rest pooled into one)."""
    expected = probabilities.reshape(-1) * counts.sum()
    assert counts[expected == 0].sum() == 0, "a token the target never samples was output"
    big = expected >= 5
    observed = np.r_[counts[big], counts[~big].sum()]
    expected = np.r_[expected[big], expected[~big].sum()]
    keep = expected > 0
    return scipy.stats.chisquare(observed[keep], expected[keep] * observed.sum()
                                 / expected[keep].sum()).pvalue


SETTINGS = {
    "temperature 1": dl.SamplingParams(temperature=1.0),
    "temperature 0.7, top-k 3": dl.SamplingParams(temperature=0.7, top_k=3),
    "top-p 0.8": dl.SamplingParams(top_p=0.8),
    # llama.cpp's: XTC's mixture, dynamic temperature, and DRY (at the second token it penalises
    # what followed the first token in the prompt, so verification reads it along the block)
    "XTC, DRY, dynamic temperature": dl.SamplingParams(
        xtc_probability=0.5, xtc_threshold=0.1, dynatemp_range=0.5, dry_multiplier=0.8,
        dry_allowed_length=1, dry_sequence_breakers=[]),
}
PROMPT = [1, 5, 2]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_first_two_tokens_are_distributed_exactly_as_the_target(pair, name):
    """Chi-square of the joint frequencies of the first two tokens over 20,000 requests (seeds
    0..19,999, one batch), gamma 2, against p(a) p(b | a) from the target's logits; fails with
    probability SIGNIFICANCE when the sampler is exact."""
    target, draft = pair
    counts, _ = first_two_tokens(target, draft, PROMPT, SETTINGS[name], seed0=0)
    exact = exact_two_token_distribution(target, PROMPT, SETTINGS[name])
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


def test_the_distribution_test_fails_when_every_proposal_is_accepted(pair, monkeypatch):
    """The same test, with the acceptance rule replaced by "always accept": the output is then
    the draft's, and the test rejects it."""
    monkeypatch.setattr(spec_round, "_accepts", lambda u, p, q: jnp.ones_like(u, bool))
    jax.clear_caches()  # the loop must be traced again with the broken rule
    try:
        target, draft = pair
        params = SETTINGS["temperature 1"]
        counts, _ = first_two_tokens(target, draft, PROMPT, params, seed0=0)
        exact = exact_two_token_distribution(target, PROMPT, params)
        assert chi_square_pvalue(counts, exact) < SIGNIFICANCE
    finally:
        jax.clear_caches()


REPEATING_PROMPT = [1, 5, 2, 1, 5]  # prompt lookup finds "1 5" and proposes 2, 1


def test_ngram_drafts_are_distributed_exactly_as_the_target(pair):
    """Prompt lookup's one-hot q: a proposal x is kept with probability p(x), and after a
    rejection the token is drawn from p without x. Chi-square as above, at temperature 1."""
    target, _ = pair
    params = SETTINGS["temperature 1"]
    counts, stats = first_two_tokens(target, NgramDrafter(), REPEATING_PROMPT, params, seed0=0)
    assert stats.tested.sum() >= SAMPLES and 0 < stats.overall_alpha < 1  # proposals were judged
    exact = exact_two_token_distribution(target, REPEATING_PROMPT, params)
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


MIROSTAT = {  # eta 1: the second token's mu moves a whole bit per bit of the first's surprise
    "v2 with a draft model": (dl.SamplingParams(mirostat=2, mirostat_tau=1.2, mirostat_eta=1.0),
                              "model", PROMPT),
    "v1 with prompt lookup": (dl.SamplingParams(mirostat=1, mirostat_tau=1.3, mirostat_eta=1.0),
                              "ngram", REPEATING_PROMPT),
}


@pytest.mark.parametrize("name", list(MIROSTAT))
def test_mirostat_drafts_are_distributed_as_non_speculative_mirostat(pair, name):
    """Mirostat's mu moves with each kept token: inside a round the target's distribution at a
    position uses mu moved by the proposals before it, and a rejection rewinds mu to the kept
    tokens (the residual or bonus token's surprise taken under the target's p). The first two
    tokens of speculative decoding, and of ``generate``, are distributed as p(a) at mu = 2 tau
    times p(b | a) at mu moved by a's surprise (chi-square as above); that distribution is far
    (total variation > 0.15) from the one with mu held at its start, so a mu not carried, or not
    rewound, fails."""
    target, draft = pair
    params, drafter, prompt = MIROSTAT[name]
    draft = draft if drafter == "model" else NgramDrafter()
    counts, stats = first_two_tokens(target, draft, prompt, params, seed0=0)
    assert stats.tested.sum() > 0 and 0 < stats.overall_alpha < 1
    exact = exact_two_token_distribution(target, prompt, params)
    held = exact_two_token_distribution(target, prompt, params.replace(mirostat_eta=0.0))
    assert 0.5 * np.abs(exact - held).sum() > 0.15
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE
    out = dl.generate(target, [prompt] * SAMPLES, params, 2, seed=0)
    plain = np.bincount(out.tokens[:, 0] * SMALL_V + out.tokens[:, 1], minlength=SMALL_V ** 2)
    assert chi_square_pvalue(plain, exact) > SIGNIFICANCE


EOS_ID = 4
HISTORY_SETTING = dl.SamplingParams(temperature=1.0, repetition_penalty=2.0,
                                    no_repeat_ngram_size=2, min_new_tokens=2)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_history_dependent_processors_are_exact_at_every_verified_position(pair, drafter):
    """Repetition penalty, no-repeat-2-gram and min-new-tokens read the history, which inside a
    round includes the proposals before each position: the first two tokens (EOS banned for both
    by min-new-tokens, the second penalised and banned by the first) are distributed as the
    target's processed p(a) p(b | a)."""
    target, draft = pair
    draft = draft if drafter == "model" else NgramDrafter()
    counts, stats = first_two_tokens(target, draft, REPEATING_PROMPT, HISTORY_SETTING, seed0=0,
                                     options=SpeculativeOptions(eos_ids=[EOS_ID]))
    assert stats.tested.sum() > 0
    exact = exact_two_token_distribution(target, REPEATING_PROMPT, HISTORY_SETTING,
                                         eos_ids=[EOS_ID])
    assert exact[EOS_ID].sum() == exact[:, EOS_ID].sum() == 0
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_constrained_drafts_are_distributed_exactly_as_the_constrained_target(pair, drafter,
                                                                              automata):
    """A constraint (hand-built "even+": an even id, then even ids or EOS 7): the draft model
    proposes under it, the n-gram drafter's forbidden proposals are cut, the target's
    distributions are masked with each position's state. The first two tokens are distributed
    as the target's p(a) p(b | a), each masked to its state's tokens and renormalised."""
    target, draft = pair
    draft = draft if drafter == "model" else NgramDrafter()
    params = SETTINGS["temperature 1"].replace(regex="even+")
    eos = SMALL_V - 1
    counts, stats = first_two_tokens(target, draft, REPEATING_PROMPT, params, seed0=0,
                                     options=SpeculativeOptions(eos_ids=[eos]))
    assert stats.tested.sum() > 0
    even = np.arange(SMALL_V) % 2 == 0
    exact = exact_two_token_distribution(target, REPEATING_PROMPT, params,
                                         allowed=(even, even | (np.arange(SMALL_V) == eos)))
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


def test_stop_strings_keep_the_distribution_exact(pair):
    """With the stop string "c" (token 2), an output is (a, b) with a != 2, or (2,) alone, with
    the target's probabilities p(a) p(b | a) and p(2): the round stops inside its kept tokens."""
    target, draft = pair
    params = SETTINGS["temperature 1"]
    out = speculative.speculative_generate(target, draft, [PROMPT] * SAMPLES, params, 2, 2,
                                           seed=0, options=SpeculativeOptions(
                                               stop_strings=["c"], tokenizer=Letters()))
    stopped = out.tokens[:, 0] == 2
    assert (out.lengths == np.where(stopped, 1, 2)).all()
    assert [out.finish_reason[i] for i in np.flatnonzero(stopped)] == ["stop"] * stopped.sum()
    cells = np.where(stopped, SMALL_V * SMALL_V, out.tokens[:, 0] * SMALL_V + out.tokens[:, 1])
    counts = np.bincount(cells, minlength=SMALL_V * SMALL_V + 1)
    joint = exact_two_token_distribution(target, PROMPT, params)
    exact = np.r_[np.where(np.arange(SMALL_V)[:, None] == 2, 0.0, joint).reshape(-1),
                  joint[2].sum()]
    assert chi_square_pvalue(counts, exact) > SIGNIFICANCE


# --- A vocabulary padded past the tokenizer's -----------------------------------------------------


def test_the_draft_tokenizer_masks_a_padded_vocabulary_for_draft_and_target():
    """The padding's logits are the largest in both models: without a tokenizer every token is
    padding; with the draft's tokenizer alone, no greedy or sampled row ever picks it, in the
    same compiled program."""
    model = padded_next_token(640, 600)
    mixed = dl.SamplingParams(temperature=[0.0, 1.0])
    bare = dl.speculative_generate(model, model, [[596], [596]], mixed, 2, 6)
    assert (bare.tokens >= 600).all()
    with experiment.count_traces() as counts:
        out = dl.speculative_generate(model, model, [[596], [596]], mixed, 2, 6, options=(
            SpeculativeOptions(draft_tokenizer=Pieces(600))))
    assert not counts
    assert out.tokens[0].tolist() == [597, 598, 599, 0, 1, 2]  # past 599 the lowest, 0
    assert (out.tokens[1] < 600).all()


# --- Bad input ------------------------------------------------------------------------------------


def learned_draft(tiny_config):
    cfg = tiny_config.replace(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
                              position="learned", max_seq_len=24)
    return dl.Transformer(cfg, rngs=nnx.Rngs(2))


@pytest.mark.parametrize("case, kwargs, message", [
    ("gamma 0", dict(gamma=0), r"gamma must be an int >= 1, got 0"),
    ("gamma 2.0", dict(gamma=2.0), r"gamma must be an int >= 1, got 2.0"),
    ("gamma too large", dict(gamma=5, options=SpeculativeOptions(max_len=20),
                             prompts=[[1] * 17, [1]]),
     r"gamma=5 is too large for the cache: prompts\[0\] has 17 tokens and one round needs "
     r"len\(prompt\) \+ gamma = 22 slots, but max_len is 20"),
    ("vocabularies", dict(draft="other vocab"),
     r"draft must have the target's vocabulary: draft vocab_size 256, target vocab_size 512"),
    ("tokenizers", dict(options=SpeculativeOptions(tokenizer=FakeTokenizer("a"),
                                                   draft_tokenizer=FakeTokenizer("b"))),
     r"draft_tokenizer must be the target's tokenizer"),
    ("draft cache", dict(draft="learned", prompts=[[1] * 30]),
     r"prompts\[0\] has 30 tokens but the draft's cache holds at most 24 \(its position table"),
    ("draft max_len", dict(draft="learned", options=SpeculativeOptions(max_len=40)),
     r"max_len must be <= 24, the draft's position table"),
    ("draft type", dict(draft="not a model"), r"draft must be an nnx.Module with a config, got str"),
    ("ngram tokenizer", dict(draft=NgramDrafter(),
                             options=SpeculativeOptions(draft_tokenizer=FakeTokenizer("a"))),
     r"draft_tokenizer must be None for a model-free drafter"),
    ("tokenizer larger", dict(options=SpeculativeOptions(draft_tokenizer=Pieces(513))),
     r"draft_tokenizer has 513 ids but the model's vocabulary has 512"),
    ("options", dict(options={"max_len": 8}),
     r"options must be a SpeculativeOptions or a DecodeOptions, got \{'max_len': 8\}"),
    ("prompts", dict(prompts=[[1], []]), r"prompts\[1\] is empty"),
])
def test_bad_input_is_rejected_before_anything_is_traced(tiny, tiny_config, tiny_draft, case,
                                                         kwargs, message):
    drafts = {"other vocab": lambda: dl.Transformer(tiny_config.replace(vocab_size=256),
                                                    rngs=nnx.Rngs(0)),
              "learned": lambda: learned_draft(tiny_config),
              "not a model": lambda: "not a model"}
    draft = kwargs.pop("draft", tiny_draft)
    draft = drafts[draft]() if isinstance(draft, str) else draft
    args = dict(prompts=[[1, 2]], gamma=3)
    args.update(kwargs)
    with experiment.count_traces() as counts, pytest.raises(ValueError, match=message):
        speculative.speculative_generate(tiny, draft, args.pop("prompts"), GREEDY,
                                         args.pop("gamma"), 4, **args)
    assert not counts


def test_ngram_drafter_validates_its_sizes():
    with pytest.raises(ValueError, match=r"min_ngram must be an int >= 1, got 0"):
        NgramDrafter(min_ngram=0)
    with pytest.raises(ValueError, match=r"min_ngram must be <= max_ngram=2, got 3"):
        NgramDrafter(max_ngram=2, min_ngram=3)


def test_exported_from_the_package():
    assert dl.speculative_generate is speculative.speculative_generate
