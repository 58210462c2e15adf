"""Sampling: every processor against hand-computed distributions, the fixed order, per-row
parameters, the greedy limits, exact sampling (chi-square) and parameter validation.

Most cases use the distribution 0.4 / 0.3 / 0.15 / 0.1 / 0.05 (its logits are the log-probabilities)
so the expected outputs are short fractions worked out by hand in the comments.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from standins import Uniform

import decodelab as dl
from decodelab import sampling
from decodelab.measure import compiles
from decodelab.sampling import processors

P = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
LOGITS = np.log(P).astype(np.float32)
ATOL = 1e-6
# Chi-square tests fail when p < SIGNIFICANCE; the seeds are fixed, so the outcome is deterministic.
SIGNIFICANCE = 1e-3

_processed_logprobs = jax.jit(sampling.processed_logprobs)
_process_logits = jax.jit(sampling.process_logits)


def history(tokens=None, prompt_lengths=None, lengths=None, batch=1, vocab=5, eos=()):
    """A ``History``; by default every row is empty (no penalties can apply)."""
    tokens = np.zeros((batch, 1), np.int32) if tokens is None else np.asarray(tokens, np.int32)
    B = tokens.shape[0]
    zeros = np.zeros((B,), np.int32)
    eos_mask = np.zeros((vocab,), bool)
    eos_mask[list(eos)] = True
    return sampling.History(
        tokens=jnp.asarray(tokens),
        prompt_lengths=jnp.asarray(zeros if prompt_lengths is None else prompt_lengths, jnp.int32),
        lengths=jnp.asarray(zeros if lengths is None else lengths, jnp.int32),
        eos_mask=jnp.asarray(eos_mask),
    )


def logprobs(params: dl.SamplingParams, logits=LOGITS, hist=None) -> np.ndarray:
    """Log-probabilities ``[B, V]`` of the distribution each row samples from."""
    logits = np.atleast_2d(logits).astype(np.float32)
    B, V = logits.shape
    hist = hist if hist is not None else history(batch=B, vocab=V)
    return np.asarray(_processed_logprobs(logits, params.per_row(B, V), hist))


def probs(params: dl.SamplingParams, logits=LOGITS, hist=None) -> np.ndarray:
    return np.exp(logprobs(params, logits, hist))


def processed(params: dl.SamplingParams, logits, hist) -> np.ndarray:
    logits = np.atleast_2d(logits).astype(np.float32)
    B, V = logits.shape
    return np.asarray(_process_logits(logits, params.per_row(B, V), hist))


# --- Each processor, by hand ----------------------------------------------------------------------


@pytest.mark.parametrize("params, expected", [
    # p^2 / sum p^2 = (.16, .09, .0225, .01, .0025) / .285
    (dict(temperature=0.5), [0.5614035, 0.3157895, 0.0789474, 0.0350877, 0.0087719]),
    # p^(1/2) / sum p^(1/2)
    (dict(temperature=2.0), np.sqrt(P) / np.sqrt(P).sum()),
    (dict(temperature=0.0), [1, 0, 0, 0, 0]),
    (dict(top_k=2), [4 / 7, 3 / 7, 0, 0, 0]),
    (dict(top_k=3), [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0]),
    # mass before each token: 0, .4, .7, .85 -> the first three stay (.85 >= .8)
    (dict(top_p=0.8), [0.4705882, 0.3529412, 0.1764706, 0, 0]),
    (dict(top_p=1e-6), [1, 0, 0, 0, 0]),
    # threshold .2 * .4 = .08: the first four stay
    (dict(min_p=0.2), [0.4 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0]),
    # entropy 1.39232 nats; |surprisal - entropy| = .476, .188, .505, .910, 1.603: by closeness the
    # order is .3, .4, .15, ... with mass before them 0, .3, .7
    (dict(typical_p=0.5), [4 / 7, 3 / 7, 0, 0, 0]),
    (dict(typical_p=0.2), [0, 1, 0, 0, 0]),  # typical sampling may drop the mode
    (dict(typical_p=0.75), [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0]),
    (dict(epsilon=0.12), [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0]),
    (dict(epsilon=0.5), [1, 0, 0, 0, 0]),  # nothing reaches .5: the most probable stays
    # min(.1, sqrt(.1) * exp(-1.39232)) = min(.1, .0786): the first four stay
    (dict(eta=0.1), [0.4 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0]),
    # logits ln p: max -0.9163, population std 0.7494
    (dict(top_n_sigma=1.0), [4 / 7, 3 / 7, 0, 0, 0]),  # keep >= -1.666
    (dict(top_n_sigma=2.0), [0.4 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0]),  # >= -2.415
])
def test_processor_gives_the_hand_computed_distribution(params, expected):
    np.testing.assert_allclose(probs(dl.SamplingParams(**params))[0], expected, rtol=0, atol=ATOL)


def test_temperature_comes_before_top_p():
    # temperature 0.5 first: .5614, .3158, .0789 -> mass before the third is .877 >= .8, so two stay
    # (top-p first would keep three, then sharpen them to .593 / .333 / .083)
    got = probs(dl.SamplingParams(temperature=0.5, top_p=0.8))[0]
    np.testing.assert_allclose(got, [0.64, 0.36, 0, 0, 0], rtol=0, atol=ATOL)


def test_top_k_at_least_the_vocabulary_keeps_all_and_is_stored_as_disabled():
    params = dl.SamplingParams(top_k=[100, 5, 4])
    np.testing.assert_array_equal(params.per_row(3, 5).top_k, [0, 0, 4])
    params = dl.SamplingParams(top_k=100)
    np.testing.assert_allclose(probs(params)[0], P, rtol=0, atol=ATOL)


def test_top_p_keeps_a_token_only_while_the_mass_before_it_is_below_p():
    # mass before each token: 0, .5, .9; .9 is not < .9, so exactly two stay
    got = probs(dl.SamplingParams(top_p=0.9), np.log([0.5, 0.4, 0.1]))[0]
    np.testing.assert_allclose(got, [5 / 9, 4 / 9, 0], rtol=0, atol=ATOL)


def test_top_p_boundary_uses_the_exclusive_mass_not_a_rounded_difference():
    # The float32 mass of the two most probable tokens is 0.8033157; with top_p exactly that, the
    # third token's mass before it is not below p, so two stay. The difference cumsum - p of the
    # third token rounds to 0.80331564 and would keep three.
    logits = np.array([0.9034701585769653, 0.0940122976899147, -0.7434992790222168,
                       -0.9217253923416138], np.float32)
    got = probs(dl.SamplingParams(top_p=float(np.float32(0.8033157))), logits)[0]
    assert np.count_nonzero(got) == 2


@pytest.mark.parametrize("k, expected_kept", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [0, 1, 2, 3])])
def test_top_k_keeps_exactly_k_taking_the_lowest_ids_among_ties(k, expected_kept):
    logits = np.array([1.0, 3.0, 3.0, 3.0, 0.0], np.float32)
    got = probs(dl.SamplingParams(top_k=k), logits)[0]
    np.testing.assert_array_equal(np.flatnonzero(got), expected_kept)


def test_top_k_one_is_greedy_with_tied_logits():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
    top1 = probs(dl.SamplingParams(top_k=1), logits)
    greedy = probs(dl.SamplingParams(temperature=0.0), logits)
    np.testing.assert_array_equal(top1, greedy)
    np.testing.assert_array_equal(np.argmax(top1, axis=-1), sampling.argmax(jnp.asarray(logits)))
    np.testing.assert_array_equal(np.argmax(top1, axis=-1), [1, 0])


def test_neutral_parameters_leave_the_model_distribution_unchanged():
    logits = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    expected = np.exp(np.asarray(jax.nn.log_softmax(logits, axis=-1)))
    np.testing.assert_array_equal(probs(dl.SamplingParams(), logits), expected)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = np.array([2.0, 1.0, -1.0, 0.5, 0.0])
    hist = history(tokens=[[0, 2]], prompt_lengths=[1], lengths=[2])  # token 0 prompt, 2 output
    got = processed(dl.SamplingParams(repetition_penalty=2.0), logits, hist)
    np.testing.assert_allclose(got[0], [1.0, 1.0, -2.0, 0.5, 0.0], rtol=0, atol=ATOL)


def test_frequency_and_presence_penalties_count_output_tokens_only():
    # prompt [3, 2], output [1, 1, 3]: token 1 twice, token 3 once, token 2 only in the prompt
    hist = history(tokens=[[3, 2, 1, 1, 3]], prompt_lengths=[2], lengths=[5])
    params = dl.SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)
    got = processed(params, np.zeros(5), hist)
    np.testing.assert_allclose(got[0], [0, -2.0, 0, -1.5, 0], rtol=0, atol=ATOL)


def test_no_repeat_ngram_bans_tokens_that_would_repeat_an_ngram_per_row():
    # row sequence 1 2 3 1 2 (prompt 1 2 3): a 3-gram "1 2 _" or a 2-gram "2 _" would repeat with 3;
    # a 1-gram bans every token seen
    tokens = np.tile([1, 2, 3, 1, 2], (4, 1))
    hist = history(tokens=tokens, prompt_lengths=[3] * 4, lengths=[5] * 4)
    got = processed(dl.SamplingParams(no_repeat_ngram_size=[0, 1, 2, 3]), np.zeros((4, 5)), hist)
    banned = [set(np.flatnonzero(np.isneginf(row)).tolist()) for row in got]
    assert banned == [set(), {1, 2, 3}, {3}, {3}]


def test_no_repeat_ngram_ignores_slots_past_the_row_length():
    # slots 4.. hold stale tokens from an older, longer sequence; only 1 2 1 counts
    hist = history(tokens=[[1, 2, 1, 4, 1, 3]], prompt_lengths=[1], lengths=[3])
    got = processed(dl.SamplingParams(no_repeat_ngram_size=2), np.zeros(5), hist)
    assert np.flatnonzero(np.isneginf(got[0])).tolist() == [2]


def test_logit_bias_adds_and_banned_tokens_are_never_drawn():
    params = dl.SamplingParams(logit_bias={1: 2.0, 3: -0.5}, banned_tokens=[0])
    got = processed(params, np.zeros(5), history())
    np.testing.assert_array_equal(got[0], [-np.inf, 2.0, 0.0, -0.5, 0.0])


def test_per_row_bias_and_bans():
    params = dl.SamplingParams(logit_bias=[{1: 1.0}, {}], banned_tokens=[[], [2, 4]])
    got = processed(params, np.zeros((2, 5)), history(batch=2))
    np.testing.assert_array_equal(got, [[0, 1, 0, 0, 0], [0, 0, -np.inf, 0, -np.inf]])


def test_min_new_tokens_bans_eos_until_reached():
    # both rows have a 1-token prompt; row 0 has 1 output token, row 1 has 2
    hist = history(tokens=[[0, 1, 2], [0, 1, 2]], prompt_lengths=[1, 1], lengths=[2, 3], eos=[4])
    got = processed(dl.SamplingParams(min_new_tokens=2), np.zeros((2, 5)), hist)
    np.testing.assert_array_equal(got, [[0, 0, 0, 0, -np.inf], [0, 0, 0, 0, 0]])


def test_greedy_sees_penalties_and_bans():
    params = dl.SamplingParams(temperature=0.0, banned_tokens=[0])
    np.testing.assert_allclose(probs(params)[0], [0, 1, 0, 0, 0], rtol=0, atol=ATOL)


# --- Greedy limits and per-row parameters ---------------------------------------------------------


@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(top_k=1), dict(top_p=1e-6),
                                    dict(min_p=1.0), dict(top_n_sigma=1e-6)])
def test_limits_of_the_truncations_equal_greedy(params):
    logits = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    expected = np.eye(64)[np.argmax(logits, axis=-1)]
    np.testing.assert_allclose(probs(dl.SamplingParams(**params), logits), expected, rtol=0,
                               atol=ATOL)


ROW_SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.7, top_k=5),
    dict(top_p=0.6, repetition_penalty=1.5),
    dict(min_p=0.1, typical_p=0.9, presence_penalty=0.5),
    dict(epsilon=0.01, eta=0.02, top_n_sigma=1.5, frequency_penalty=0.3),
]


def test_per_row_parameters_equal_each_row_processed_alone():
    rng = np.random.default_rng(2)
    B, V = len(ROW_SETTINGS), 32
    logits = rng.normal(size=(B, V)).astype(np.float32)
    tokens = rng.integers(0, V, size=(B, 12))
    together = dl.SamplingParams(**{name: [s.get(name, p.neutral) for s in ROW_SETTINGS]
                                    for name, p in processors.PARAMETERS.items()})
    batch = probs(together, logits, history(tokens, [4] * B, [12] * B, vocab=V))
    for row, setting in enumerate(ROW_SETTINGS):
        alone = probs(dl.SamplingParams(**setting), logits[row],
                      history(tokens[row:row + 1], [4], [12], vocab=V))
        np.testing.assert_allclose(batch[row], alone[0], rtol=0, atol=ATOL, err_msg=str(setting))


# --- Exact sampling -------------------------------------------------------------------------------


STAT_LOGITS = np.log([0.3, 0.25, 0.2, 0.12, 0.08, 0.05]).astype(np.float32)
STAT_SETTINGS = [
    dict(),
    dict(temperature=0.6),
    dict(temperature=1.7),
    dict(top_k=3),
    dict(top_p=0.7),
    dict(min_p=0.3),
    dict(typical_p=0.6),
    dict(epsilon=0.1),
    dict(eta=0.1),
    dict(top_n_sigma=1.0),
    dict(temperature=0.8, top_k=4, top_p=0.9),
    dict(xtc_probability=0.5, xtc_threshold=0.1),  # the mixture of removing .3 .25 .2 and not
    dict(top_k=4, xtc_probability=0.7, xtc_threshold=0.2),
    dict(temperature=0.8, dynatemp_range=0.5, dynatemp_exponent=2.0),
]


@pytest.fixture(scope="module")
def draws():
    """``draws(setting)``: 4000 tokens from independent keys (seeds 0..3999 at position 7)."""
    R = 4000
    keys = sampling.row_keys(sampling.seed_keys(jnp.arange(R, dtype=jnp.uint32)),
                             jnp.full((R,), 7, jnp.int32))
    sample = jax.jit(sampling.draw)

    def get(setting):
        lp = logprobs(dl.SamplingParams(**setting), STAT_LOGITS)  # [1, V]
        tokens = sample(jnp.asarray(np.repeat(lp, R, axis=0)), keys)
        return np.exp(lp[0]), np.bincount(np.asarray(tokens), minlength=len(STAT_LOGITS))

    return get


@pytest.mark.parametrize("setting", STAT_SETTINGS, ids=str)
def test_empirical_distribution_matches_the_processed_distribution(draws, setting):
    """Chi-square goodness of fit at significance 1e-3; removed tokens are never drawn."""
    p, counts = draws(setting)
    support = p > 0
    assert counts[~support].sum() == 0
    if support.sum() > 1:
        q = p[support].astype(np.float64)
        expected = q / q.sum() * counts.sum()
        assert scipy.stats.chisquare(counts[support], expected).pvalue > SIGNIFICANCE


def test_row_keys_depend_on_seed_and_position_only():
    seeds = jnp.array([3, 3, 4], jnp.uint32)
    positions = jnp.array([5, 6, 5], jnp.int32)
    keys = jax.random.key_data(sampling.row_keys(sampling.seed_keys(seeds), positions))
    alone = jax.random.key_data(jax.random.fold_in(jax.random.key(jnp.uint32(3)), 5))
    np.testing.assert_array_equal(keys[0], alone)
    assert not np.array_equal(keys[0], keys[1]) and not np.array_equal(keys[0], keys[2])


# --- Validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), r"temperature must be 0 or >= 0.01 \(0 means greedy\), got -1.0"),
    (dict(temperature=float("nan")), r"temperature must be 0 or >= 0.01 .*, got nan"),
    (dict(temperature=float("inf")), r"temperature must be 0 or >= 0.01 .*, got inf"),
    (dict(temperature=[0.5, -0.1]), r"temperature\[1\] must be 0 or >= 0.01 .*, got -0.1"),
    (dict(temperature="hot"), r"temperature must be a number or one per row, got 'hot'"),
    (dict(temperature=[[1.0]]), r"temperature must be a scalar or a 1-D sequence"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\] \(1 disables it\), got 0.0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\] .*, got 1.5"),
    (dict(top_k=-1), r"top_k must be an int >= 0 \(0 disables it\), got -1"),
    (dict(top_k=2.5), r"top_k must be an int or one per row, got 2.5"),
    (dict(top_k=True), r"top_k must be an int or one per row, got True"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\] .*, got 1.5"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\] .*, got -0.1"),
    (dict(typical_p=0.0), r"typical_p must be in \(0, 1\] .*, got 0.0"),
    (dict(typical_p=2.0), r"typical_p must be in \(0, 1\] .*, got 2.0"),
    (dict(epsilon=1.0), r"epsilon must be in \[0, 1\) .*, got 1.0"),
    (dict(eta=-0.1), r"eta must be in \[0, 1\) .*, got -0.1"),
    (dict(top_n_sigma=-1.0), r"top_n_sigma must be >= 0 .*, got -1.0"),
    (dict(repetition_penalty=0.0),
     r"repetition_penalty must be in \[0.01, 100\] \(1 disables it\), got 0.0"),
    (dict(repetition_penalty=float("nan")), r"repetition_penalty must be in \[0.01, 100\] .* nan"),
    (dict(frequency_penalty=float("inf")), r"frequency_penalty must be in \[-100, 100\] .* inf"),
    (dict(presence_penalty=float("nan")), r"presence_penalty must be in \[-100, 100\] .*, got nan"),
    (dict(no_repeat_ngram_size=-2), r"no_repeat_ngram_size must be an int >= 0 .*, got -2"),
    (dict(min_new_tokens=-1), r"min_new_tokens must be an int >= 0 .*, got -1"),
    (dict(logit_bias={1: float("inf")}), r"logit_bias\[1\] must be a finite number"),
    (dict(logit_bias={"a": 1.0}), r"logit_bias keys must be int token ids, got 'a'"),
    (dict(logit_bias=[1.0]), r"logit_bias\[0\] must be a dict"),
    (dict(banned_tokens="abc"), r"banned_tokens must be a list of token ids"),
    (dict(banned_tokens=[1, [2]]), r"banned_tokens must be a list of token ids or a list with one"),
])
def test_bad_parameter_is_rejected_with_its_name_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=[0.5, 1.0]), r"temperature has 2 values but the batch has 3 rows"),
    (dict(top_k=[1, 2, 3, 4]), r"top_k has 4 values but the batch has 3 rows"),
    (dict(logit_bias=[{}, {}]), r"logit_bias has 2 dicts but the batch has 3 rows"),
    (dict(banned_tokens=[[1], [2]]), r"banned_tokens has 2 lists but the batch has 3 rows"),
    (dict(logit_bias={5: 1.0}), r"logit_bias keys must be token ids in \[0, 5\), got 5"),
    (dict(banned_tokens=[-1]), r"banned_tokens must be token ids in \[0, 5\), got -1"),
    (dict(banned_tokens=[0, 1, 2, 3, 4]), r"banned_tokens bans all 5 tokens of row 0"),
])
def test_per_row_values_must_fit_the_batch_and_vocabulary(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SamplingParams(**kwargs).per_row(3, 5)


# --- Storage ranges, for every registered parameter -----------------------------------------------

INT_PARAMETERS = [name for name, p in processors.PARAMETERS.items() if p.dtype == "int32"]
FLOAT_PARAMETERS = [name for name, p in processors.PARAMETERS.items() if p.dtype == "float32"]


def test_every_registered_parameter_is_stored_as_int32_or_float32():
    assert set(INT_PARAMETERS) | set(FLOAT_PARAMETERS) == set(processors.PARAMETERS)
    assert INT_PARAMETERS and FLOAT_PARAMETERS


@pytest.mark.parametrize("name", INT_PARAMETERS)
@pytest.mark.parametrize("value", [2**31, [0, 2**31]])
def test_an_int_parameter_that_would_wrap_in_int32_is_rejected(name, value):
    neutral = processors.PARAMETERS[name].neutral
    value = [neutral, 2**31] if isinstance(value, list) else value
    where = rf"{name}\[1\]" if isinstance(value, list) else name
    with pytest.raises(ValueError, match=rf"^{where} must .*int32.*, got 2147483648$"):
        dl.SamplingParams(**{name: value})


@pytest.mark.parametrize("name", FLOAT_PARAMETERS)
@pytest.mark.parametrize("value", [1e39, -1e39])
def test_a_float_parameter_that_would_overflow_float32_is_rejected(name, value):
    got = re.escape(repr(value))
    with pytest.raises(ValueError, match=rf"^{name} must .*, got {got}$"):
        dl.SamplingParams(**{name: value})
    with pytest.raises(ValueError, match=rf"^{name}\[1\] must .*, got {got}$"):
        dl.SamplingParams(**{name: [processors.PARAMETERS[name].neutral, value]})


# The ends of each parameter's range that it admits.
RANGE_ENDS = [(name, end) for name, p in processors.PARAMETERS.items()
              for end, open_end in ((p.low, p.open_low), (p.high, p.open_high))
              if end is not None and not open_end]


@pytest.mark.parametrize("name, end", RANGE_ENDS)
def test_the_ends_of_each_range_are_accepted_and_stored_finite(name, end):
    # (DRY's default breakers are strings, which need a tokenizer: none here)
    rows = dl.SamplingParams(**{name: end}, dry_sequence_breakers=[]).per_row(1, 5)
    assert np.isfinite(np.asarray(getattr(rows, name))).all()


def test_the_largest_int32_is_accepted():
    rows = dl.SamplingParams(min_new_tokens=2**31 - 1).per_row(1, 5)
    assert int(rows.min_new_tokens[0]) == 2**31 - 1


@pytest.mark.parametrize("bias", [1e39, -1e39, 100.5, -1e30])
def test_a_logit_bias_past_its_range_is_rejected(bias):
    got = re.escape(repr(bias))
    with pytest.raises(ValueError, match=rf"^logit_bias\[1\] must be a finite number in "
                                         rf"\[-100, 100\], got {got}; ban a token"):
        dl.SamplingParams(logit_bias={1: bias})


# Values of the right type that would make every probability vanish, overflow float32 (NaN) or
# round to a value outside the range in float32: (field, value, the range the message names).
VANISHING = [
    ("repetition_penalty", 1e-38, r"in \[0.01, 100\]"),
    ("repetition_penalty", 1e38, r"in \[0.01, 100\]"),
    ("temperature", 1e-45, r"0 or >= 0.01"),
    ("temperature", 1e-3, r"0 or >= 0.01"),
    ("frequency_penalty", 1e38, r"in \[-100, 100\]"),
    ("frequency_penalty", -1e38, r"in \[-100, 100\]"),
    ("presence_penalty", 3e38, r"in \[-100, 100\]"),
    ("presence_penalty", -1e30, r"in \[-100, 100\]"),
    ("top_p", 1e-46, r"in \(0, 1\]"),
    ("typical_p", 1e-46, r"in \(0, 1\]"),
    ("epsilon", 0.99999999, r"in \[0, 1\)"),
    ("eta", 0.99999999, r"in \[0, 1\)"),
]


@pytest.mark.parametrize("name, value, allowed", VANISHING)
def test_a_value_that_would_vanish_or_overflow_is_refused_before_anything_compiles(
        name, value, allowed):
    model = Uniform(5)
    with compiles.count_compiles() as counts, pytest.raises(ValueError) as error:
        dl.generate(model, [[1]], dl.SamplingParams(**{name: value}), 4)
    message = str(error.value)
    assert message.startswith(f"{name} must be ") and re.search(allowed, message), message
    assert message.endswith(f"got {value!r}"), message
    assert sum(counts.values()) == 0


def test_no_repeat_ngram_longer_than_the_row_bans_nothing_and_ends():
    # n = 2**31 - 1 once looped that many times; past the row's length no n-gram can repeat
    hist = history(tokens=[[1, 2, 1, 2]], prompt_lengths=[1], lengths=[4])
    got = processed(dl.SamplingParams(no_repeat_ngram_size=2**31 - 1), np.zeros(5), hist)
    np.testing.assert_array_equal(got[0], np.zeros(5))
