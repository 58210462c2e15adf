"""Text-quality metrics on hand-made samples whose values are known: distinct-n, repetition,
self-BLEU, Zipf coefficient, length and EOS rate, and continuation perplexity under stand-in models
and the real Transformer; bad arguments are refused by name."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import standins
from flax import nnx
from standins import Chars

import decodelab as dl
from decodelab.measure import perplexity as metrics

# --- Distinct-n and repetition --------------------------------------------------------------------


def test_distinct_n_is_the_share_of_distinct_ngrams_within_each_sample_averaged():
    # sample 0: unigrams 1 2 1 2 1 -> 2 of 5; bigrams 12 21 12 21 -> 2 of 4; trigrams -> 2 of 3
    # sample 1: all distinct
    samples = [[1, 2, 1, 2, 1], [3, 4, 5, 6]]
    assert metrics.distinct_n(samples, 1) == pytest.approx((2 / 5 + 1) / 2, abs=1e-12)
    assert metrics.distinct_n(samples, 2) == pytest.approx((2 / 4 + 1) / 2, abs=1e-12)
    assert metrics.distinct_n(samples, 3) == pytest.approx((2 / 3 + 1) / 2, abs=1e-12)


def test_distinct_n_leaves_out_samples_without_an_ngram():
    assert metrics.distinct_n([[7, 7, 7], [1, 2]], 3) == pytest.approx(1 / 1, abs=1e-12)
    assert metrics.distinct_n([[1, 2], []], 3) is None


def test_repetition_rate_is_the_share_of_4grams_seen_before_in_the_sample():
    # 1 2 3 4 1 2 3 4: 4-grams 1234 2341 3412 4123 1234 -> the last repeats the first: 1 of 5
    assert metrics.repetition_rate([[1, 2, 3, 4, 1, 2, 3, 4]]) == pytest.approx(0.2, abs=1e-12)
    # a loop of one token: 4-grams 7777 x 5, four of them repeats
    assert metrics.repetition_rate([[7] * 8, list(range(8))]) == pytest.approx(0.4, abs=1e-12)
    assert metrics.repetition_rate([[1, 2, 3]]) is None


# --- Self-BLEU ------------------------------------------------------------------------------------


def test_self_bleu_of_copies_is_100_and_of_disjoint_texts_is_0():
    assert metrics.self_bleu(["to be or not"] * 3) == pytest.approx(100.0, abs=1e-9)
    assert metrics.self_bleu(["to be or not", "that is the question"]) == pytest.approx(0.0)


def test_self_bleu_scores_each_sample_against_all_the_others():
    # "a" scores 100 against references {"a", "b"} (it matches one of them), "b" scores 0
    a, b = "the king is dead", "long live our queen"
    assert metrics.self_bleu([a, a, b]) == pytest.approx((100 + 100 + 0) / 3, abs=1e-9)


def test_self_bleu_with_brevity_penalty_and_partial_matches_by_hand():
    """"a b c d" against "a b c d e f g h": all precisions 1, brevity penalty exp(1 - 8/4);
    the long one against the short one: precisions 4/8, 3/7, 2/6, 1/5, no penalty."""
    short, long = "a b c d", "a b c d e f g h"
    by_hand = (100 * math.exp(-1) + 100 * (4 / 8 * 3 / 7 * 2 / 6 * 1 / 5) ** 0.25) / 2
    assert metrics.self_bleu([short, long]) == pytest.approx(by_hand, abs=1e-9)


# --- Zipf, length, EOS ----------------------------------------------------------------------------


def _tokens_with_counts(counts):
    return [token for token, c in enumerate(counts) for _ in range(c)]


@pytest.mark.parametrize("counts, s", [([60, 30, 20, 15, 12, 10], 1.0), ([36, 9, 4], 2.0)])
def test_zipf_coefficient_recovers_an_exact_power_law(counts, s):
    tokens = _tokens_with_counts(counts)
    rng = np.random.default_rng(0)
    rng.shuffle(tokens)
    half = len(tokens) // 2  # counts are pooled over samples
    assert metrics.zipf_coefficient([tokens[:half], tokens[half:]]) == pytest.approx(s, abs=1e-9)


def test_zipf_coefficient_needs_two_distinct_tokens():
    assert metrics.zipf_coefficient([[5, 5, 5]]) is None


def test_mean_length_and_eos_rate():
    samples = [[1, 2, 0], [3], [4, 5, 6, 7], [0]]
    assert metrics.mean_length(samples) == 2.25
    assert metrics.eos_rate(samples, eos_ids=0) == 0.5
    assert metrics.eos_rate(samples, eos_ids=[0, 7]) == 0.75
    assert metrics.eos_rate([[], [1]], eos_ids=1) == 0.5


# --- Continuation perplexity ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


V = 16


uniform = standins.uniform(V)
next_is_last_plus_one = standins.next_is_last_plus_one(V)


def test_uniform_model_gives_perplexity_v():
    ppl = metrics.continuation_perplexity(uniform, [[1, 2], [3]], [[4, 5, 6], [7]])
    assert ppl == pytest.approx(V, rel=1e-6)


def test_only_continuation_tokens_are_scored_each_given_its_prompt():
    """Prompt [3] makes 4 certain; [9] makes 4 impossible (log-prob -1e4). The prompt's own tokens
    (which the model gets wrong) are never scored."""
    logprobs = metrics.continuation_logprobs(next_is_last_plus_one, [[3], [0, 9]],
                                             [[4, 5, 6], [4]])
    np.testing.assert_allclose(logprobs[0], [0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(logprobs[1], [-1e4], rtol=1e-6)
    assert metrics.continuation_perplexity(next_is_last_plus_one, [[3]] * 40,
                                           [[4, 5, 6]] * 40, batch_size=16) == pytest.approx(1.0)


def test_empty_continuations_count_no_tokens():
    logprobs = metrics.continuation_logprobs(uniform, [[1], [2]], [[], [3, 4]])
    assert [len(lp) for lp in logprobs] == [0, 2]
    with pytest.raises(ValueError, match=r"continuations must hold at least one token"):
        metrics.continuation_perplexity(uniform, [[1]], [[]])


def test_transformer_continuation_logprobs_equal_a_full_forward_pass(tiny):
    """The reference pass reads each sequence unpadded, at its own length."""
    model = tiny
    graphdef, weights = nnx.split(model)
    forward = jax.jit(lambda w, t: jax.nn.log_softmax(nnx.merge(graphdef, w)(t), axis=-1))
    prompts, continuations = [[5, 6, 7], [9, 8, 7, 6, 5]], [[10, 11, 12], [13]]  # both 6 tokens
    got = metrics.continuation_logprobs(model, prompts, continuations, batch_size=4)
    full = np.asarray(forward(weights, jnp.asarray([p + c for p, c in zip(prompts, continuations)],
                                                   jnp.int32)))  # [B, T, V]
    for row, (prompt, cont) in enumerate(zip(prompts, continuations)):
        expected = [full[row, len(prompt) - 1 + i, t] for i, t in enumerate(cont)]
        np.testing.assert_allclose(got[row], expected, rtol=0, atol=1e-5)


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: metrics.distinct_n([[1, 2]], 0), r"n must be an int >= 1, got 0"),
    (lambda: metrics.distinct_n([], 2), r"samples is empty"),
    (lambda: metrics.distinct_n("abc", 2), r"samples must be a list of token-id lists, got str"),
    (lambda: metrics.distinct_n([[1.5, 2]], 1), r"samples\[0\] must be a 1-D list of int token"),
    (lambda: metrics.self_bleu(["only one"]), r"texts must be a list of at least 2 strings"),
    (lambda: metrics.self_bleu(["a", 3]), r"texts\[1\] must be a str, got int"),
    (lambda: metrics.continuation_perplexity(uniform, [[1]], [[2], [3]]),
     r"prompts and continuations must pair up, got 1 prompts and 2 continuations"),
    (lambda: metrics.continuation_perplexity(uniform, [[]], [[2]]), r"prompts\[0\] is empty"),
    (lambda: metrics.continuation_perplexity(uniform, [[1]], [[-2]]),
     r"token ids must be in \[0, V\), got \[-2, 1\]"),
    (lambda: metrics.continuation_perplexity(uniform, [[1]], [[2]], batch_size=0),
     r"batch_size must be an int >= 1, got 0"),
])
def test_bad_arguments_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- decodelab.measure.quality: prompts, token statistics, the row ----------------------------------------


def test_held_out_prompts_start_at_paragraphs_and_the_reference_follows_the_prompt():
    from decodelab.measure import quality
    from decodelab.text import data

    prompts = quality.held_out_prompts(Chars(), per_document=2, prompt_tokens=12, new_tokens=8)
    texts = data.split_documents("test")
    assert [p.document for p in prompts] == [name for name in sorted(texts) for _ in range(2)]
    for p in prompts:
        text = texts[p.document]
        assert len(p.tokens) == 12 and len(p.reference) == 8
        at = text.find(Chars().decode(p.tokens + p.reference))
        assert at > 0 and text[at - 2:at] == "\n\n"


def test_token_stats_count_the_candidates_each_strategy_allows(tiny):
    from decodelab.measure import quality

    prompts, continuations = [[5, 6, 7], [9]], [[10, 11, 12], [13, 14]]
    expected = np.concatenate(metrics.continuation_logprobs(tiny, prompts, continuations,
                                                            batch_size=4))
    for params, candidates in [(dl.SamplingParams(top_k=5), 5), (dl.SamplingParams.greedy(), 1),
                               (dl.SamplingParams(temperature=0.5), 512)]:
        stats = quality.token_stats(tiny, prompts, continuations, params, batch_size=4)
        np.testing.assert_array_equal(stats["candidates"], [candidates] * 5)
        np.testing.assert_allclose(stats["logprob"], expected, rtol=0, atol=1e-5)
    penalised = quality.token_stats(tiny, prompts, continuations,
                                    dl.SamplingParams(repetition_penalty=1.3), batch_size=4)
    assert "candidates" not in penalised  # its allowed set depends on the history
    constrained = quality.token_stats(tiny, prompts, continuations,
                                      dl.SamplingParams(regex="x+"), batch_size=4)
    assert "candidates" not in constrained  # so does a constraint's


def test_quality_row_of_greedy_samples_marks_them_identical_and_all_top1(tiny):
    from decodelab.measure import quality

    prompts = [quality.HeldOutPrompt("x", [5, 6, 7], [8, 9, 10, 11]),
               quality.HeldOutPrompt("y", [20], [21, 22, 23, 24])]
    greedy = quality.Sampled(dl.SamplingParams.greedy())
    samples = greedy.continuations(tiny, prompts, new_tokens=4, samples=3, seed=0, eos_id=0)
    row = quality.quality_row(prompts, samples, tokenizer=Chars(), generator=tiny,
                              params=greedy.params, batch_size=4)
    assert row["samples"] == 6 and row["identical_samples"] == 1.0
    assert row["top1_rate"] == 1.0 and row["candidates_median"] == 1.0
    assert row["ppl_scorer"] is None and row["mean_length"] == 4.0
    human = quality.Human().continuations(tiny, prompts, new_tokens=4, samples=3, seed=0,
                                          eos_id=0)
    row = quality.quality_row(prompts, human, tokenizer=Chars(), generator=tiny, scorer=tiny,
                              batch_size=4)
    assert row["self_bleu"] is None and row["identical_samples"] is None
    assert row["ppl_scorer"] == pytest.approx(row["ppl_generator"], rel=1e-9)


def test_quality_row_keeps_per_prompt_sums_whose_ratios_are_the_row(tiny):
    from decodelab.measure import quality

    prompts = [quality.HeldOutPrompt("x", [5, 6, 7], [8, 9, 10, 11]),
               quality.HeldOutPrompt("y", [20], [21, 22, 23, 24])]
    sampled = quality.Sampled(dl.SamplingParams(temperature=1.0))
    samples = sampled.continuations(tiny, prompts, new_tokens=6, samples=3, seed=0, eos_id=0)
    row = quality.quality_row(prompts, samples, tokenizer=Chars(), generator=tiny, scorer=tiny,
                              params=sampled.params, batch_size=4)
    per = {name: np.asarray(values) for name, values in row["per_prompt"].items()}
    assert all(len(values) == 2 for values in per.values())
    assert per["samples"].tolist() == [3.0, 3.0]
    ratio = lambda top, bottom: per[top].sum() / per[bottom].sum()  # noqa: E731
    assert row["ppl_generator"] == pytest.approx(math.exp(ratio("nll_generator", "tokens")),
                                                 rel=1e-12)
    assert row["ppl_scorer"] == pytest.approx(math.exp(ratio("nll_scorer", "tokens")), rel=1e-12)
    assert row["mean_length"] == pytest.approx(ratio("tokens", "samples"), rel=1e-12)
    assert row["eos_rate"] == pytest.approx(ratio("eos", "samples"), abs=1e-12)
    assert row["top1_rate"] == pytest.approx(ratio("top1", "tokens"), rel=1e-12)
    assert row["improbable_rate"] == pytest.approx(ratio("improbable", "tokens"), abs=1e-12)
    assert row["distinct_2"] == pytest.approx(ratio("distinct_2", "ngram_samples_2"), rel=1e-12)
    assert row["repetition_4"] == pytest.approx(1 - ratio("distinct_4", "ngram_samples_4"),
                                                abs=1e-12)
    assert row["self_bleu"] == pytest.approx(per["self_bleu"].mean(), rel=1e-12)
    assert row["identical_samples"] == pytest.approx(per["identical"].mean(), abs=1e-12)


def test_a_drawn_strategy_reports_the_surprise_of_what_it_drew_and_a_search_its_one_text(tiny):
    from decodelab.measure import quality

    prompts = [quality.HeldOutPrompt("x", [5, 6, 7], [8, 9, 10, 11]),
               quality.HeldOutPrompt("y", [20], [21, 22, 23, 24])]
    mirostat = quality.Sampled(dl.SamplingParams(mirostat=2, mirostat_tau=3.0))
    drawn = mirostat.decode(tiny, prompts, new_tokens=5, samples=2, seed=0, eos_id=0)
    samples, logprobs = drawn
    assert [[len(lp) for lp in g] for g in logprobs] == [[len(s) for s in g] for g in samples]
    row = quality.quality_row(prompts, drawn, tokenizer=Chars(), generator=tiny,
                              params=mirostat.params, batch_size=4)
    bits = -sum(sum(lp) for g in logprobs for lp in g) / math.log(2)
    tokens = sum(len(s) for g in samples for s in g)
    assert row["surprise_sampled"] == pytest.approx(bits / tokens, rel=1e-9)
    assert row["surprise_generator"] == pytest.approx(math.log2(row["ppl_generator"]), rel=1e-9)
    assert row["candidates_median"] is None  # Mirostat's kept set depends on its mu
    with pytest.raises(ValueError, match="samples.logprobs must hold one value per token"):
        quality.quality_row(prompts, quality.Drawn(samples, [[lp[:-1] for lp in g]
                                                             for g in logprobs]),
                            tokenizer=Chars(), generator=tiny)
    contrastive = quality.Contrastive(0.6, 3)
    texts, none = contrastive.decode(tiny, prompts, new_tokens=4, samples=3, seed=0, eos_id=0)
    assert none is None and all(len(g) == 3 and g[0] == g[1] == g[2] for g in texts)
    assert texts == quality.Contrastive(0.6, 3).continuations(tiny, prompts, new_tokens=4,
                                                              samples=3, seed=1, eos_id=0)
    # CFG at scale 1 is plain decoding; guided strategies count no candidates.
    plain = quality.Sampled(dl.SamplingParams(temperature=0.7))
    cfg = quality.Sampled(dl.SamplingParams(temperature=0.7), guidance_scale=1.0)
    assert cfg.continuations(tiny, prompts, new_tokens=4, samples=2, seed=0, eos_id=0) == \
        plain.continuations(tiny, prompts, new_tokens=4, samples=2, seed=0, eos_id=0)
    dola = quality.Sampled(dl.SamplingParams.greedy(), dola_layers="high")
    assert cfg.params is None and dola.params is None and plain.params is not None
    assert len(dola.continuations(tiny, prompts, new_tokens=4, samples=1, seed=0, eos_id=0)) == 2


def test_a_decode_section_names_any_sampling_field_and_the_guided_and_search_methods():
    from ml_collections import config_dict
    from study_config import config_module

    from decodelab.measure import quality, strategies

    decode = config_module("sampling").get_config().decode
    decode.dry_multiplier, decode.temperature = 0.8, 0.7
    tokenizer = object()
    got = strategies.strategy(decode, tokenizer)
    assert isinstance(got, quality.Sampled) and got.tokenizer is tokenizer
    assert (got.sampling_params.dry_multiplier, got.guidance_scale, got.dola_layers) == (
        0.8, None, None)
    decode.guidance_scale, decode.dola_layers = 1.5, "high"
    got = strategies.strategy(decode)
    assert (got.guidance_scale, got.dola_layers) == (1.5, "high")
    decode.method, decode.top_k = "contrastive", 4
    assert strategies.strategy(decode) == quality.Contrastive(0.6, 4)
    old = config_dict.ConfigDict(dict(method="sample", temperature=0.5))  # a row's older section
    assert strategies.strategy(old).sampling_params.temperature == 0.5
    decode.method = "nucleus"
    with pytest.raises(ValueError, match="decode.method must be one of"):
        strategies.strategy(decode)
