"""llama.cpp's samplers in decodelab, by their definitions (no llama.cpp needed; the check
against llama.cpp's own is ``test_llama_cpp_samplers``): DRY against a step-by-step Python
transcription of llama.cpp's ``llama_sampler_dry_apply`` on random histories, every row of a
batch with settings of its own; XTC's mixture and dynamic temperature by hand and by their
definitions in float64; neutral values are the identity; greedy rows see DRY and not XTC; the
breakers' table; and bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from standins import Uniform

import decodelab as dl
from decodelab import sampling
from decodelab.measure import compiles
from decodelab.sampling.penalties import DRY_PENALTY_CAP

ATOL = 1e-6
P = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
LOGITS = np.log(P).astype(np.float32)

_process = jax.jit(sampling.process_logits)
_logprobs = jax.jit(sampling.processed_logprobs)


def history(tokens, lengths, vocab):
    tokens = np.asarray(tokens, np.int32)
    return sampling.History(tokens=jnp.asarray(tokens),
                            prompt_lengths=jnp.zeros((tokens.shape[0],), jnp.int32),
                            lengths=jnp.asarray(lengths, jnp.int32),
                            eos_mask=jnp.zeros((vocab,), bool))


def probs(params, logits=LOGITS, hist=None):
    logits = np.atleast_2d(logits).astype(np.float32)
    B, V = logits.shape
    hist = history(np.zeros((B, 1)), np.zeros(B), V) if hist is None else hist
    return np.exp(np.asarray(_logprobs(logits, params.per_row(B, V), hist)))


# --- DRY ------------------------------------------------------------------------------------------


def llama_dry(tokens, V, multiplier, base, allowed, last_n, breakers):
    """``[V]`` penalties of llama.cpp's DRY after ``tokens``, its steps written plainly: the
    window of the last ``last_n`` tokens (-1: all), the repeat limit from the last breaker in
    it, for each earlier end k the longest match of the window's end (naive, where llama.cpp
    runs the Z-algorithm), the longest per following token, and the exponent clamp."""
    penalty = np.zeros(V, np.float64)
    if multiplier == 0 or last_n == 0:
        return penalty
    window = tokens[-last_n:] if last_n > 0 else tokens
    W = len(window)
    if W <= allowed:
        return penalty
    limit = next((i for i in range(W) if window[W - 1 - i] in breakers), W)
    if limit < allowed:
        return penalty
    longest = {}
    for k in range(1, W):
        n = 0
        while n + k < W and window[W - 1 - n] == window[W - 1 - n - k]:
            n += 1
        n = min(n, limit)
        if n >= allowed:
            token = window[W - k]
            longest[token] = max(longest.get(token, 0), n)
    max_exponent = int(88.7228391 / math.log(base)) if base > 1.000001 else 0
    for token, n in longest.items():
        if token not in breakers:
            exponent = n - allowed
            if max_exponent > 0:
                exponent = min(exponent, max_exponent)
            penalty[token] = multiplier * base ** exponent
    return penalty


DRY_V = 8
DRY_ROWS = [  # (multiplier, base, allowed, last_n, breakers)
    (0.8, 1.75, 2, -1, []), (0.8, 1.75, 2, -1, [5]), (1.0, 2.0, 1, 12, [5, 6]),
    (2.0, 1.1, 3, 20, []), (0.5, 3.0, 2, 6, [6]), (0.0, 1.75, 2, -1, [5]), (0.8, 1.75, 2, 0, []),
    (1.0, 1.0, 1, -1, [5]), (3.0, 50.0, 1, -1, []), (0.8, 1.75, 4, 30, [5]),
]


@pytest.mark.parametrize("seed", range(3))
def test_dry_penalises_as_llama_cpps_definition_row_by_row(seed):
    """Rows of random tokens over a small alphabet with breakers (5, 6) among them, one periodic
    row (long repeats: the exponent clamp and the penalty cap), every row with its own setting:
    each row's penalties equal llama.cpp's steps (capped at ``DRY_PENALTY_CAP``)."""
    rng = np.random.default_rng(seed)
    R, S = len(DRY_ROWS), 40
    tokens = rng.choice(7, (R, S), p=[0.25, 0.25, 0.2, 0.1, 0.1, 0.05, 0.05]).astype(np.int32)
    tokens[8] = np.arange(S) % 2  # "0 1 0 1 ...": repeats of every length
    lengths = rng.integers(S // 2, S + 1, R)
    lengths[8] = S
    mult, base, allowed, last_n, breakers = zip(*DRY_ROWS)
    params = dl.SamplingParams(dry_multiplier=list(mult), dry_base=list(base),
                               dry_allowed_length=list(allowed), dry_penalty_last_n=list(last_n),
                               dry_sequence_breakers=[list(b) for b in breakers])
    got = -np.asarray(_process(np.zeros((R, DRY_V), np.float32), params.per_row(R, DRY_V),
                               history(tokens, lengths, DRY_V)))
    hits = 0
    for row, setting in enumerate(DRY_ROWS):
        expected = llama_dry(tokens[row, :lengths[row]].tolist(), DRY_V, *setting[:4],
                             set(setting[4]))
        expected = np.minimum(expected, DRY_PENALTY_CAP)
        np.testing.assert_allclose(got[row], expected, rtol=1e-5, atol=0, err_msg=str(setting))
        hits += int((expected > 0).sum())
    assert hits >= 5 and got[8].max() == np.float32(DRY_PENALTY_CAP)  # the cap was reached


def test_dry_counts_only_the_tokens_since_the_last_breaker():
    # "1 2 3 4 1 2 0 1 2" ends with "1 2", which 3 (slot 2) and 0 (slot 6) followed before: both
    # repeats have n = 2 = allowed, penalty 1.75 ** 0. With 4 a breaker the 5 tokens since it hold
    # both; with 0 a breaker, 0 is never penalised and the 2 tokens since it still reach n = 2;
    # with 2 a breaker (the last token) nothing is
    tokens = [[1, 2, 3, 4, 1, 2, 0, 1, 2]]
    for breakers, expected in (([], {3: 1.0, 0: 1.0}), ([4], {0: 1.0, 3: 1.0}), ([0], {3: 1.0}),
                               ([2], {})):
        params = dl.SamplingParams(dry_multiplier=1.0, dry_sequence_breakers=breakers)
        got = np.asarray(_process(np.zeros((1, 6), np.float32), params.per_row(1, 6),
                                  history(tokens, [9], 6)))[0]
        want = np.zeros(6)
        for token, penalty in expected.items():
            want[token] = -penalty
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=str(breakers))


def test_greedy_rows_see_dry_but_not_xtc():
    # history "0 1 2 0 1": DRY (allowed 2) penalises 2 by 1; the argmax moves from 2 to 3
    logits = np.array([[0.0, 0.0, 1.0, 0.5, 0.0]], np.float32)
    hist = history([[0, 1, 2, 0, 1]], [5], 5)
    greedy = dl.SamplingParams(temperature=0.0, dry_multiplier=1.0, dry_sequence_breakers=[])
    np.testing.assert_array_equal(probs(greedy, logits, hist)[0], [0, 0, 0, 1, 0])
    token, _, _ = sampling.greedy_choice(jnp.asarray(logits), greedy.per_row(1, 5), hist)
    assert int(token[0]) == 3
    xtc = dl.SamplingParams(temperature=0.0, xtc_probability=1.0, xtc_threshold=0.0)
    np.testing.assert_array_equal(probs(xtc, logits)[0], [0, 0, 1, 0, 0])


# --- XTC ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting, expected", [
    # >= .1: .4 .3 .15 .1; all go but the least probable, .1: then .1 / .15 and .05 / .15
    (dict(xtc_probability=1.0, xtc_threshold=0.1), [0, 0, 0, 2 / 3, 1 / 3]),
    # the mixture: half of it, and half of P
    (dict(xtc_probability=0.5, xtc_threshold=0.1), [0.2, 0.15, 0.075, 0.05 + 1 / 3, 0.025 + 1 / 6]),
    (dict(xtc_probability=1.0, xtc_threshold=0.35), P),  # one token reaches .35: nothing goes
    (dict(xtc_probability=1.0, xtc_threshold=0.6), P),  # none reaches it
    (dict(xtc_probability=1.0, xtc_threshold=0.0), [0, 0, 0, 0, 1]),  # all but the least
    (dict(xtc_probability=1.0, xtc_threshold=0.2, top_k=2), [0, 1, 0, 0, 0]),  # after top-k
])
def test_xtc_by_hand(setting, expected):
    np.testing.assert_allclose(probs(dl.SamplingParams(**setting))[0], expected, rtol=0,
                               atol=ATOL)


def test_xtc_spares_the_highest_id_among_tied_least_probable_tokens():
    logits = np.log([[0.3, 0.3, 0.3, 0.1]]).astype(np.float32)
    got = probs(dl.SamplingParams(xtc_probability=1.0, xtc_threshold=0.2), logits)[0]
    np.testing.assert_allclose(got, [0, 0, 0.75, 0.25], rtol=0, atol=ATOL)


# --- Dynamic temperature --------------------------------------------------------------------------


def temp_ext(logits: np.ndarray, temperature: float, spread: float, exponent: float):
    """llama.cpp's dynamic temperature by its definition, in float64: the probabilities."""
    x = logits.astype(np.float64)
    p = np.exp(x - np.logaddexp.reduce(x))
    normalised = -np.sum(p * np.log(p)) / np.log(len(x))
    lo, hi = max(0.0, temperature - spread), temperature + spread
    y = x / (lo + (hi - lo) * normalised ** exponent)
    return np.exp(y - np.logaddexp.reduce(y))


@pytest.mark.parametrize("temperature, spread, exponent", [
    (1.0, 0.5, 1.0), (0.8, 0.3, 2.0), (0.5, 1.0, 0.5), (0.7, 0.2, 0.0)])
def test_dynamic_temperature_is_its_definition(temperature, spread, exponent):
    logits = (np.random.default_rng(0).normal(size=(2, 64)) * [[1.0], [4.0]]).astype(np.float32)
    params = dl.SamplingParams(temperature=temperature, dynatemp_range=spread,
                               dynatemp_exponent=exponent)
    got = probs(params, logits)
    for row in range(2):
        np.testing.assert_allclose(got[row], temp_ext(logits[row], temperature, spread, exponent),
                                   rtol=0, atol=ATOL)


def test_dynamic_temperature_counts_only_the_allowed_tokens():
    # two allowed tokens of equal logit: normalised entropy 1 -> temperature t + r; uniform anyway
    logits = np.array([[1.0, 1.0, 0.0, 0.0]], np.float32)
    params = dl.SamplingParams(temperature=0.5, dynatemp_range=0.5, banned_tokens=[2, 3])
    np.testing.assert_allclose(probs(params, logits)[0], [0.5, 0.5, 0, 0], rtol=0, atol=ATOL)


# --- Neutral values, the table, bad input ---------------------------------------------------------


@pytest.mark.parametrize("setting, plain", [
    (dict(xtc_probability=0.0, xtc_threshold=0.01), dict()),
    (dict(temperature=0.7, dynatemp_range=0.0, dynatemp_exponent=3.0), dict(temperature=0.7)),
    (dict(dry_multiplier=0.0, dry_base=3.0, dry_allowed_length=1), dict()),
    (dict(dry_multiplier=2.0, dry_penalty_last_n=0, dry_allowed_length=1), dict()),
])
def test_neutral_values_are_the_identity(setting, plain):
    logits = np.random.default_rng(1).normal(size=(2, 16)).astype(np.float32)
    hist = history(np.tile(np.arange(8) % 3, (2, 1)), [8, 8], 16)
    np.testing.assert_array_equal(probs(dl.SamplingParams(**setting), logits, hist),
                                  probs(dl.SamplingParams(**plain), logits, hist))


class Pieces:
    """A tokenizer stand-in: what ``token_bytes`` spells."""

    def token_bytes(self):
        return [b"a", b"\n", b"b:", None, b"**", b"c", b"\"x"]


def test_breakers_are_the_tokens_whose_text_contains_one_and_rows_without_dry_have_none():
    params = dl.SamplingParams(dry_multiplier=[0.8, 0.8, 0.0, 0.8],
                               dry_sequence_breakers=[["\n", ":"], ["*", 5], [":"], []])
    table = np.asarray(params.per_row(4, 8, tokenizer=Pieces()).dry_breakers)
    assert [np.flatnonzero(row).tolist() for row in table] == [[1, 2], [4, 5], [], []]
    default = dl.SamplingParams(dry_multiplier=0.8).per_row(1, 8, tokenizer=Pieces())
    assert np.flatnonzero(np.asarray(default.dry_breakers)[0]).tolist() == [1, 2, 4, 6]


@pytest.mark.parametrize("kwargs, message", [
    (dict(xtc_probability=-0.1), r"xtc_probability must be in \[0, 1\] \(0 disables it\), got "
                                 r"-0.1"),
    (dict(xtc_probability=1.5), r"xtc_probability must be in \[0, 1\] .*, got 1.5"),
    (dict(xtc_threshold=1.1), r"xtc_threshold must be in \[0, 1\] .*, got 1.1"),
    (dict(xtc_threshold=-0.5), r"xtc_threshold must be in \[0, 1\] .*, got -0.5"),
    (dict(dry_multiplier=-1.0), r"dry_multiplier must be in \[0, 100\] .*, got -1.0"),
    (dict(dry_base=0.5), r"dry_base must be in \[1, 100\] .*, got 0.5"),
    (dict(dry_allowed_length=0), r"dry_allowed_length must be an int >= 1 .*, got 0"),
    (dict(dry_penalty_last_n=-2), r"dry_penalty_last_n must be an int >= -1 \(-1 is the whole "
                                  r"row, 0 disables DRY\), got -2"),
    (dict(dynatemp_range=-0.5), r"dynatemp_range must be in \[0, 100\] .*, got -0.5"),
    (dict(dynatemp_exponent=-1.0), r"dynatemp_exponent must be in \[0, 100\] .*, got -1.0"),
    (dict(temperature=[0.0, 1.0], dynatemp_range=0.5),
     r"dynatemp_range must be 0 where temperature is 0 \(greedy\), got 0.5"),
    (dict(dry_sequence_breakers="\n"), r"dry_sequence_breakers must be a list of non-empty "
                                       r"strings or token ids"),
    (dict(dry_sequence_breakers=["\n", ""]), r"dry_sequence_breakers must be a list"),
    (dict(dry_sequence_breakers=[["\n"], [1.5]]), r"dry_sequence_breakers\[1\] must be a list"),
])
def test_bad_input_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dry_multiplier=0.8), r"dry_sequence_breakers has strings \['\\n', ':', '\"', '\*'\]: "
                               r"finding their tokens needs the model's tokenizer"),
    (dict(dry_multiplier=0.8, dry_sequence_breakers=[9]),
     r"dry_sequence_breakers token ids must be in \[0, 8\), got 9"),
    (dict(dry_multiplier=0.8, dry_sequence_breakers=[[1], [2]]),
     r"dry_sequence_breakers has 2 lists but the batch has 3 rows"),
])
def test_breakers_must_fit_the_vocabulary_and_strings_need_a_tokenizer(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.SamplingParams(**kwargs).per_row(3, 8)


def test_dry_without_a_tokenizer_is_refused_before_anything_compiles():
    model = Uniform(5)
    with compiles.count_compiles() as counts, pytest.raises(ValueError, match="tokenizer"):
        dl.generate(model, [[1]], dl.SamplingParams(dry_multiplier=0.8), 4)
    assert sum(counts.values()) == 0
