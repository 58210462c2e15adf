"""The request layer: how seeds become random streams, where stop strings cut, and the int32 bound
on every size argument of the decoders and the serving engine."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab import request
from decodelab.serving import Request, SlotEngine

V = 512
GREEDY = dl.SamplingParams.greedy()
TOO_BIG = 2**31  # one past int32


class Uniform(nnx.Module):
    """Every next token equally likely, so a sample shows its random stream alone."""

    def __init__(self):
        self.config = dl.ModelConfig(vocab_size=V, d_model=1, n_layers=1, n_heads=1,
                                     position="nope")
        self.base = nnx.Param(jnp.zeros((V,)))

    def __call__(self, tokens, *, cache, num_valid=None):
        B, T = tokens.shape
        num_valid = jnp.full((B,), T, jnp.int32) if num_valid is None else num_valid
        return jnp.broadcast_to(self.base[...], (B, T, V)), cache.advance(num_valid)


@pytest.fixture(scope="module")
def uniform():
    return Uniform()


# --- Seeds ----------------------------------------------------------------------------------------


def test_every_seed_and_row_of_an_int_seed_has_its_own_stream(uniform):
    """(seed s, row r) for s, r < 8: 64 streams of 6 tokens, pairwise different (with seed + r,
    row 1 at seed 0 would repeat row 0 at seed 1)."""
    streams = []
    for s in range(8):
        out = dl.generate(uniform, [[0]] * 8, dl.SamplingParams(), 6, seed=s)
        streams += [tuple(tokens) for tokens in out.token_lists()]
    assert len(set(streams)) == 64


def first_draw(key) -> int:
    return int(jax.random.categorical(key, jax.nn.log_softmax(jnp.zeros((V,)))))


def test_int_seed_row_r_draws_position_p_with_fold_in_key_seed_r_then_p(uniform):
    out = dl.generate(uniform, [[0, 0]] * 3, dl.SamplingParams(), 1, seed=11)
    expected = [first_draw(jax.random.fold_in(jax.random.fold_in(jax.random.key(11), r), 2))
                for r in range(3)]
    assert out.tokens[:, 0].tolist() == expected


def test_a_per_request_seed_draws_position_p_with_fold_in_key_seed_p(uniform):
    """The needle guarantee: with a list of seeds, a request's key is its own seed's, whatever
    its row or batch-mates."""
    out = dl.generate(uniform, [[0, 0], [0, 0, 0]], dl.SamplingParams(), 1, seed=[11, 5])
    expected = [first_draw(jax.random.fold_in(jax.random.key(11), 2)),
                first_draw(jax.random.fold_in(jax.random.key(5), 3))]
    assert out.tokens[:, 0].tolist() == expected


# --- Stop strings ---------------------------------------------------------------------------------


class CountingLetters:
    """Token i is the letter ``chr(97 + i % 26)``; counts its decode calls."""

    def __init__(self):
        self.calls = 0

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        self.calls += 1
        return "".join(chr(97 + i % 26) for i in ids)


def first_containing_prefix(ids, stop_strings, tokenizer) -> int | None:
    """The definition, by brute force: the shortest prefix whose text holds a stop string."""
    return next((k for k in range(1, len(ids) + 1)
                 if any(s in tokenizer.decode(ids[:k]) for s in stop_strings)), None)


def test_stop_string_cut_matches_the_shortest_containing_prefix():
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(0, 4, int(rng.integers(1, 40))).tolist()  # letters a..d: many matches
        stops = ["".join(rng.choice(list("abcd"), int(rng.integers(1, 4)))) for _ in range(2)]
        brute = first_containing_prefix(ids, stops, CountingLetters())
        assert request.stop_string_cut(ids, stops, CountingLetters()) == brute, (ids, stops)


def test_stop_string_cut_decodes_log_n_times_not_once_per_prefix():
    ids = [i % 20 for i in range(1024)]  # letters a..t, so "xyz" occurs only where placed
    ids[700:703] = [23, 24, 25]
    tokenizer = CountingLetters()
    assert request.stop_string_cut(ids, ["xyz"], tokenizer) == 703
    assert tokenizer.calls <= 1 + math.ceil(math.log2(1024))
    tokenizer = CountingLetters()
    assert request.stop_string_cut(ids[:700], ["xyz"], tokenizer) is None
    assert tokenizer.calls == 1


# --- Sizes fit int32 ------------------------------------------------------------------------------


SIZE_CALLS = {
    "generate max_new_tokens": (lambda m: dl.generate(m, [[1]], GREEDY, TOO_BIG),
                                "max_new_tokens"),
    "generate max_len": (lambda m: dl.generate(m, [[1]], GREEDY, 2, max_len=TOO_BIG), "max_len"),
    "generate return_top_logprobs": (
        lambda m: dl.generate(m, [[1]], GREEDY, 2, return_top_logprobs=TOO_BIG),
        "return_top_logprobs"),
    "beam width": (lambda m: dl.beam_search(m, [[1]], TOO_BIG, 2), "width"),
    "beam max_new_tokens": (lambda m: dl.beam_search(m, [[1]], 2, TOO_BIG), "max_new_tokens"),
    "beam min_new_tokens": (lambda m: dl.beam_search(m, [[1]], 2, 2, min_new_tokens=TOO_BIG),
                            "min_new_tokens"),
    "beam max_len": (lambda m: dl.beam_search(m, [[1]], 2, 2, max_len=TOO_BIG), "max_len"),
    "speculative gamma": (
        lambda m: dl.speculative_generate(m, dl.NgramDrafter(), [[1]], GREEDY, TOO_BIG, 2),
        "gamma"),
    "speculative max_new_tokens": (
        lambda m: dl.speculative_generate(m, dl.NgramDrafter(), [[1]], GREEDY, 2, TOO_BIG),
        "max_new_tokens"),
    "speculative max_len": (
        lambda m: dl.speculative_generate(m, dl.NgramDrafter(), [[1]], GREEDY, 2, 2,
                                          max_len=TOO_BIG), "max_len"),
    "ngram max_ngram": (lambda m: dl.NgramDrafter(max_ngram=TOO_BIG), "max_ngram"),
    "engine num_slots": (lambda m: SlotEngine(m, TOO_BIG, 8), "num_slots"),
    "engine max_len": (lambda m: SlotEngine(m, 1, TOO_BIG), "max_len"),
    "engine max_stop_sequences": (lambda m: SlotEngine(m, 1, 8, max_stop_sequences=TOO_BIG),
                                  "max_stop_sequences"),
    "engine max_stop_width": (lambda m: SlotEngine(m, 1, 8, max_stop_width=TOO_BIG),
                              "max_stop_width"),
    "engine step n": (lambda m: SlotEngine(m, 1, 8).step(TOO_BIG), "n"),
    "request max_new_tokens": (lambda m: Request(id=0, prompt=[1], max_new_tokens=TOO_BIG),
                               "max_new_tokens"),
}


@pytest.mark.parametrize("case", SIZE_CALLS)
def test_a_size_past_int32_is_refused_naming_the_argument(uniform, case):
    call, name = SIZE_CALLS[case]
    with pytest.raises(ValueError, match=rf"^{name} must be <= 2\*\*31 - 1 .*, got 2147483648$"):
        call(uniform)


def test_a_beam_length_penalty_past_float32_is_refused(uniform):
    with pytest.raises(ValueError, match=r"^length_penalty must be in the range of float32"):
        dl.beam_search(uniform, [[1]], 2, 2, length_penalty=1e39)


def test_a_default_max_len_past_int32_is_refused(uniform):
    with pytest.raises(ValueError, match=r"max_len \(default: .*\) is 2147483663, past 2\*\*31 - 1"):
        dl.generate(uniform, [[1]], GREEDY, 2**31 - 1)


# --- One table ------------------------------------------------------------------------------------


def test_every_decoder_reports_finish_reasons_from_the_one_table(uniform):
    out = dl.generate(uniform, [[1]], GREEDY, 2)
    beams = dl.beam_search(uniform, [[1]], 2, 2)
    spec = dl.speculative_generate(uniform, dl.NgramDrafter(), [[1]], GREEDY, 2, 2)
    done = SlotEngine(uniform, 1, 8).run([Request(id=0, prompt=[1], max_new_tokens=2)])
    assert out.finish_reason == spec.finish_reason == [done[0].finish_reason] == ["length"]
    assert beams.finish_reason == [["length", "length"]]
    assert request.FINISH_REASONS[request.LENGTH] == "length"
