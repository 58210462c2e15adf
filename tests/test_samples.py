"""n samples per prompt (``generate(..., n=...)``, ``SpeculativeOptions(n=...)``): one prefill,
outputs ``[P, n, ...]``, sample 0 the ``n=1`` output, the samples independent draws."""

import numpy as np
import pytest
import scipy.stats

import decodelab as dl
from tests.standins import Chain, NextToken

ALPHA = 1e-3  # significance level of the chi-square tests (fixed seeds: deterministic)
# A first-order chain over 4 tokens: the next token's distribution after each token.
TABLE = np.array([[0.1, 0.2, 0.3, 0.4],
                  [0.4, 0.3, 0.2, 0.1],
                  [0.25, 0.25, 0.25, 0.25],
                  [0.7, 0.1, 0.1, 0.1]])
SAMPLED = dl.SamplingParams(temperature=1.0)
GREEDY = dl.SamplingParams.greedy()
OUTPUTS = dl.DecodeOptions(return_top_logprobs=2, return_entropy=True)


@pytest.fixture(scope="module")
def chain():
    return Chain(TABLE)


@pytest.mark.parametrize("seed", [[3, 9], 5], ids=["per-request seeds", "one seed"])
def test_sample_0_is_the_single_sample_output_and_every_field_is_grouped(chain, seed):
    prompts = [[0, 1, 2], [3]]
    one = dl.generate(chain, prompts, SAMPLED, 6, seed=seed, options=OUTPUTS)
    many = dl.generate(chain, prompts, SAMPLED, 6, seed=seed, n=3, options=OUTPUTS)
    assert many.tokens.shape == (2, 3, 6) and many.lengths.shape == (2, 3)
    assert many.top_ids.shape == (2, 3, 6, 2) and many.entropy.shape == (2, 3, 6)
    assert many.valid.shape == (2, 3, 6) and many.valid.all()
    assert many.finish_reason == [["length"] * 3] * 2
    for name in ("tokens", "lengths", "logprobs", "top_logprobs", "top_ids", "entropy"):
        np.testing.assert_array_equal(getattr(many, name)[:, 0], getattr(one, name), err_msg=name)
    lists = many.token_lists()
    assert [len(samples) for samples in lists] == [3, 3] and lists[1][0] == one.token_lists()[1]
    assert len({tuple(s) for s in lists[0]}) > 1  # the samples differ


def test_a_prompts_samples_do_not_depend_on_its_batch_mates(chain):
    alone = dl.generate(chain, [[3]], SAMPLED, 5, seed=[9], n=4)
    batched = dl.generate(chain, [[0, 1], [3], [2]], SAMPLED, 5, seed=[1, 9, 4], n=4)
    np.testing.assert_array_equal(batched.tokens[1], alone.tokens[0])


def test_greedy_samples_are_identical():
    out = dl.generate(NextToken(), [[1, 2], [7]], GREEDY, 4, n=3)
    assert out.token_lists() == [[[3, 4, 5, 6]] * 3, [[8, 9, 10, 11]] * 3]


def test_samples_are_independent_draws_from_the_distribution(chain):
    """1024 rows (256 prompts [2] of 4 samples, one seed): the first tokens follow TABLE[2], the
    second tokens TABLE[first] (read back from each sample's copy of the prompt's cache), and
    samples 0 and 1 (and 2 and 3) of a prompt are independent (a 4 x 4 contingency test)."""
    out = dl.generate(chain, [[2]] * 256, SAMPLED, 2, seed=11, n=4)
    first, second = out.tokens[..., 0], out.tokens[..., 1]  # [256, 4]
    counts = np.bincount(first.ravel(), minlength=4)
    assert scipy.stats.chisquare(counts, TABLE[2] * first.size).pvalue > ALPHA
    pairs = np.zeros((4, 4))
    np.add.at(pairs, (first.ravel(), second.ravel()), 1)
    expected = counts[:, None] * TABLE
    assert scipy.stats.chisquare(pairs.ravel(), expected.ravel()).pvalue > ALPHA
    joint = np.zeros((4, 4))
    np.add.at(joint, (first[:, 0::2].ravel(), first[:, 1::2].ravel()), 1)
    assert scipy.stats.chi2_contingency(joint).pvalue > ALPHA


def test_speculative_samples_match_the_single_sample_call(chain):
    prompts, seeds = [[0, 1, 2], [3]], [3, 9]
    one = dl.speculative_generate(chain, chain, prompts, SAMPLED, 2, 6, seed=seeds)
    many = dl.speculative_generate(chain, chain, prompts, SAMPLED, 2, 6, seed=seeds,
                                   options=dl.SpeculativeOptions(n=3))
    assert many.tokens.shape == (2, 3, 6) and many.stats.rounds.shape == (6,)
    np.testing.assert_array_equal(many.tokens[:, 0], one.tokens)


@pytest.mark.parametrize("n, message", [
    (0, r"n must be an int >= 1, got 0"),
    (2.0, r"n must be an int >= 1, got 2.0"),
    (2**31, r"n must be <= 2\*\*31 - 1"),
    (10**8, r"generate with len\(prompts\)=1, n=100000000, .* lower len\(prompts\) or n or"),
])
def test_a_bad_sample_count_is_refused_before_anything_runs(chain, n, message):
    with pytest.raises(ValueError, match=message):
        dl.generate(chain, [[1]], SAMPLED, 4, n=n)


def test_a_bad_speculative_sample_count_is_refused(chain):
    with pytest.raises(ValueError, match=r"n must be an int >= 1, got -1"):
        dl.speculative_generate(chain, chain, [[1]], SAMPLED, 2, 4,
                                options=dl.SpeculativeOptions(n=-1))
    with pytest.raises(ValueError, match=r"speculative_generate with len\(prompts\)=1, n=10"):
        dl.speculative_generate(chain, chain, [[1]], SAMPLED, 2, 4,
                                options=dl.SpeculativeOptions(n=10**8))
