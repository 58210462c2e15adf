"""The request layer: how seeds become random streams, where stop strings cut, and the int32 bound
on every size argument of the decoders and the serving engine."""

import dataclasses
import math
import os

import jax
import numpy as np
import pytest
from flax import nnx
from standins import NextToken, Uniform

import decodelab as dl
from decodelab.decode import output, request
from decodelab.measure import compiles
from decodelab.serving import EngineOptions, Request, SlotEngine

V = 512
GREEDY = dl.SamplingParams.greedy()
TOO_BIG = 2**31  # one past int32


@pytest.fixture(scope="module")
def uniform():
    return Uniform(V)


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
    """The token the draw takes from V equally likely tokens with ``key``: the inverse of the
    distribution function in id order at one uniform u (``sampling.draw``), so floor(u * V)
    (exact in float32: V is a power of two and the partial sums are integers)."""
    return int(np.floor(np.float32(jax.random.uniform(key, ())) * np.float32(V)))


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
        assert output.stop_string_cut(ids, stops, CountingLetters()) == brute, (ids, stops)


def test_stop_string_cut_decodes_log_n_times_not_once_per_prefix():
    ids = [i % 20 for i in range(1024)]  # letters a..t, so "xyz" occurs only where placed
    ids[700:703] = [23, 24, 25]
    tokenizer = CountingLetters()
    assert output.stop_string_cut(ids, ["xyz"], tokenizer) == 703
    assert tokenizer.calls <= 1 + math.ceil(math.log2(1024))
    tokenizer = CountingLetters()
    assert output.stop_string_cut(ids[:700], ["xyz"], tokenizer) is None
    assert tokenizer.calls == 1


# --- Sizes fit int32 ------------------------------------------------------------------------------


SIZE_CALLS = {
    "generate max_new_tokens": (lambda m: dl.generate(m, [[1]], GREEDY, TOO_BIG),
                                "max_new_tokens"),
    "generate max_len": (
        lambda m: dl.generate(m, [[1]], GREEDY, 2, options=dl.DecodeOptions(max_len=TOO_BIG)),
        "max_len"),
    "generate return_top_logprobs": (
        lambda m: dl.generate(m, [[1]], GREEDY, 2,
                              options=dl.DecodeOptions(return_top_logprobs=TOO_BIG)),
        "return_top_logprobs"),
    "beam width": (lambda m: dl.beam_search(m, [[1]], TOO_BIG, 2), "width"),
    "beam max_new_tokens": (lambda m: dl.beam_search(m, [[1]], 2, TOO_BIG), "max_new_tokens"),
    "beam min_new_tokens": (
        lambda m: dl.beam_search(m, [[1]], 2, 2, options=dl.BeamOptions(min_new_tokens=TOO_BIG)),
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
                                          options=dl.SpeculativeOptions(max_len=TOO_BIG)),
        "max_len"),
    "ngram max_ngram": (lambda m: dl.NgramDrafter(max_ngram=TOO_BIG), "max_ngram"),
    "engine num_slots": (lambda m: SlotEngine(m, TOO_BIG, 8), "num_slots"),
    "engine max_len": (lambda m: SlotEngine(m, 1, TOO_BIG), "max_len"),
    "engine max_stop_sequences": (lambda m: EngineOptions(max_stop_sequences=TOO_BIG),
                                  "max_stop_sequences"),
    "engine max_stop_width": (lambda m: EngineOptions(max_stop_width=TOO_BIG), "max_stop_width"),
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
    with pytest.raises(ValueError, match=r"^length_penalty must be a finite number in \[0, 4\]"):
        dl.beam_search(uniform, [[1]], 2, 2, length_penalty=1e39)


def test_a_default_max_len_past_int32_is_refused(uniform):
    # the prompt bucket 16 plus the budget's bucket 2**31
    with pytest.raises(ValueError,
                       match=r"max_len \(default: .*\) is 2147483664, past 2\*\*31 - 1"):
        dl.generate(uniform, [[1]], GREEDY, 2**31 - 1)


# --- Buckets --------------------------------------------------------------------------------------


def test_speculative_decoding_and_beam_search_compile_once_per_bucket():
    """Budgets 9, 12 and 16 (one output width) with 3 or 4 prompts (one row bucket): each loop
    compiles once, on a stand-in of its own vocabulary (no other test's program is reused), and
    each output is cut back to its own prompts and budget."""
    model = NextToken(vocab_size=27)
    with compiles.count_compiles() as counts:
        for n, b in [(9, 3), (12, 4), (16, 3)]:
            prompts = [[i] for i in range(b)]
            spec = dl.speculative_generate(model, dl.NgramDrafter(), prompts, GREEDY, 2, n)
            beams = dl.beam_search(model, prompts, 2, n)
            assert spec.token_lists() == [[(i + 1 + k) % 27 for k in range(n)] for i in range(b)]
            assert spec.stats.accepted_per_round.shape == (b, n)
            assert beams.best() == spec.token_lists()
    assert counts["_speculative_loop"] == 1 and counts["_beam_loop"] == 1


# --- One table ------------------------------------------------------------------------------------


def test_every_decoder_reports_finish_reasons_from_the_one_table(uniform):
    out = dl.generate(uniform, [[1]], GREEDY, 2)
    beams = dl.beam_search(uniform, [[1]], 2, 2)
    spec = dl.speculative_generate(uniform, dl.NgramDrafter(), [[1]], GREEDY, 2, 2)
    done = SlotEngine(uniform, 1, 8).run([Request(id=0, prompt=[1], max_new_tokens=2)])
    assert out.finish_reason == spec.finish_reason == [done[0].finish_reason] == ["length"]
    assert beams.finish_reason == [["length", "length"]]
    assert request.FINISH_REASONS[request.LENGTH] == "length"


# --- Sizes fit the model, the cache and memory ----------------------------------------------------

GIB = 2**30


@pytest.fixture
def one_gib_limit():
    """A 1 GiB memory limit, so the refusals below do not depend on this machine's memory."""
    previous = dl.set_memory_limit(GIB)
    yield
    dl.set_memory_limit(previous)


def allocation_forbidden(monkeypatch):
    """Make every decoder's first allocation fail the test at once, so a size check that regresses
    fails fast instead of allocating gigabytes."""
    from decodelab.decode import beam
    from decodelab.decode import generation as decode
    from decodelab.serving import engine
    from decodelab.speculative import generation as speculative

    def allocates(*args, **kwargs):
        raise AssertionError("allocated before the memory check refused the call")

    for module, name in ((decode, "prefill"), (beam, "beam_prefill"),
                         (speculative, "prefill"), (engine, "empty_state")):
        monkeypatch.setattr(module, name, allocates)


def test_the_default_memory_limit_is_the_device_memory():
    from decodelab import checks

    limit, source = checks.memory_limit()
    if jax.devices()[0].platform == "cpu":
        assert (limit, source) == (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                                   "this machine's memory")
    else:
        assert limit == jax.devices()[0].memory_stats()["bytes_limit"]


def test_set_memory_limit_returns_the_previous_setting_and_none_restores_the_default():
    from decodelab import checks

    assert dl.set_memory_limit(GIB) is None
    assert checks.memory_limit() == (GIB, "set by set_memory_limit")
    assert dl.set_memory_limit(None) == GIB
    assert checks.memory_limit() == checks.device_memory()
    with pytest.raises(ValueError, match=r"^nbytes must be an int >= 1, got 0$"):
        dl.set_memory_limit(0)


def test_a_cache_past_the_memory_limit_is_refused_stating_its_size(uniform, one_gib_limit,
                                                                   monkeypatch):
    """Uniform's cache holds 2 x 4 bytes per slot: max_len 10**9 is 8e9 bytes of cache, 4e9 of
    token buffer, a [1, 16, 512] float32 prefill block and 8 logprobs (4 new tokens: the
    bucket of 8 columns)."""
    allocation_forbidden(monkeypatch)
    with pytest.raises(ValueError) as error:
        dl.generate(uniform, [[1]], GREEDY, 4, options=dl.DecodeOptions(max_len=10**9))
    assert str(error.value) == (
        "generate with len(prompts)=1, max_new_tokens=4, max_len=1000000000 needs 11.2 GiB "
        "(KV cache 7.5 GiB, token buffer 3.7 GiB, prefill logits 32.0 KiB, logprobs 32 B), more "
        "than the memory limit of 1.0 GiB (set by set_memory_limit); lower len(prompts) or "
        "max_new_tokens or max_len, or raise the limit with decodelab.set_memory_limit")


HUGE_CALLS = {
    "generate max_new_tokens": (lambda m: dl.generate(m, [[1]], GREEDY, 10**9), "generate"),
    "generate max_len": (
        lambda m: dl.generate(m, [[1]], GREEDY, 2, options=dl.DecodeOptions(max_len=10**9)),
        "generate"),
    "beam max_new_tokens": (lambda m: dl.beam_search(m, [[1]], 2, 10**9), "beam_search"),
    "beam width": (lambda m: dl.beam_search(m, [[1]] * 1000, V, 8, max_len=10**4),
                   "beam_search"),
    "beam max_len": (lambda m: dl.beam_search(m, [[1]], 2, 2, max_len=10**9), "beam_search"),
    "speculative max_new_tokens": (
        lambda m: dl.speculative_generate(m, dl.NgramDrafter(), [[1]], GREEDY, 4, 10**9),
        "speculative_generate"),
    "speculative max_len": (
        lambda m: dl.speculative_generate(m, dl.NgramDrafter(), [[1]], GREEDY, 4, 4,
                                          options=dl.SpeculativeOptions(max_len=10**9)),
        "speculative_generate"),
    "engine num_slots": (lambda m: SlotEngine(m, 10**8, 8), "SlotEngine"),
    "engine max_len": (lambda m: SlotEngine(m, 1, 10**9), "SlotEngine"),
}


@pytest.mark.parametrize("case", HUGE_CALLS)
def test_every_decoder_refuses_a_size_past_the_memory_limit_before_allocating(
        uniform, one_gib_limit, monkeypatch, case):
    allocation_forbidden(monkeypatch)
    call, name = HUGE_CALLS[case]
    with pytest.raises(ValueError, match=rf"^{name} with .* needs [\d.]+ [GT]iB \(KV cache "):
        call(uniform)


@pytest.fixture(scope="module")
def learned16():
    """A learned-position model whose position table stops every row at 16 tokens."""
    cfg = dl.ModelConfig(vocab_size=V, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256,
                         max_seq_len=16, position="learned")
    return dl.Transformer(cfg, rngs=nnx.Rngs(0))


def sizes_at_most(monkeypatch, module, name, limit):
    """Wrap ``module.name`` so that a static size argument past ``limit`` fails the test before
    anything is allocated."""
    real = getattr(module, name)

    def checked(*args, **kwargs):
        sizes = dict(kwargs)
        if "outputs" in kwargs:  # an OutputSpec
            sizes["max_new_tokens"] = kwargs["outputs"].max_new_tokens
        for size in ("max_new_tokens", "gamma", "max_len"):
            assert sizes.get(size, 0) <= limit, (size, sizes[size])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, checked)


def test_max_new_tokens_is_clamped_to_the_position_table(learned16, monkeypatch):
    """The rows of a 16-position model stop at 16 tokens: a 3-token prompt has 13 columns of
    output whatever the budget, the tokens of a budget of 13."""
    from decodelab.decode import generation as decode

    sizes_at_most(monkeypatch, decode, "prefill", 16)
    huge = dl.generate(learned16, [[1, 2, 3]], GREEDY, 10**9)
    exact = dl.generate(learned16, [[1, 2, 3]], GREEDY, 13)
    assert huge.tokens.shape == (1, 13)
    assert huge.lengths.tolist() == [13] and huge.finish_reason == ["length"]
    assert huge.tokens.tolist() == exact.tokens.tolist()


def test_max_new_tokens_is_clamped_to_the_room_after_the_shortest_prompt(uniform, monkeypatch):
    from decodelab.decode import generation as decode

    sizes_at_most(monkeypatch, decode, "prefill", 8)
    out = dl.generate(uniform, [[1, 2, 3], [1]], GREEDY, 10**9,
                      options=dl.DecodeOptions(max_len=8))
    assert out.tokens.shape == (2, 7)
    assert out.lengths.tolist() == [5, 7]
    assert out.token_lists() == [[0] * 5, [0] * 7]


def test_beam_max_new_tokens_is_clamped_to_the_room_after_the_shortest_prompt(uniform,
                                                                              monkeypatch):
    from decodelab.decode import beam

    sizes_at_most(monkeypatch, beam, "beam_prefill", 8)
    out = dl.beam_search(uniform, [[1, 2, 3], [1]], 2, 10**9, max_len=8)
    assert out.tokens.shape == (2, 2, 7)
    assert out.lengths.tolist() == [[5, 5], [7, 7]]


def test_speculative_gamma_is_capped_at_the_max_new_tokens_bucket(uniform, monkeypatch):
    """gamma = 10**6 with 4 new tokens drafts 8 per round (the budget's bucket, so that another
    budget in it compiles nothing); the output is greedy's (token 0), 4 tokens."""
    from decodelab.speculative import generation as speculative

    sizes_at_most(monkeypatch, speculative, "initial_state", 32)
    sizes_at_most(monkeypatch, speculative, "prefill", 32)
    out = dl.speculative_generate(uniform, dl.NgramDrafter(), [[1, 2, 3]], GREEDY, 10**6, 4)
    assert out.stats.gamma == 8 and out.stats.tested_by_position.shape == (1, 8)
    assert out.token_lists() == [[0, 0, 0, 0]]


# --- Deliberate NaN -------------------------------------------------------------------------------


def assert_nan_exactly_at_padding(out):
    """NaN in every float field exactly where ``valid`` is False; PAD_TOKEN in the ids there."""
    padding = ~out.valid
    assert np.array_equal(out.tokens == request.PAD_TOKEN, padding)
    assert np.array_equal(np.isnan(out.logprobs), padding)
    assert np.array_equal(np.isnan(out.entropy), padding)
    assert np.array_equal(np.isnan(out.top_logprobs), np.repeat(padding[..., None], 2, axis=-1))
    assert np.array_equal(out.top_ids == request.PAD_TOKEN,
                          np.repeat(padding[..., None], 2, axis=-1))


def test_generate_logprobs_are_nan_exactly_past_each_rows_length(uniform):
    """Rows stopped at max_len 8 after prompts of 3, 1 and 6 tokens: 5, 7 and 2 outputs."""
    out = dl.generate(uniform, [[1, 2, 3], [1], [1] * 6], dl.SamplingParams(), 10**9,
                      options=dl.DecodeOptions(max_len=8, return_top_logprobs=2,
                                               return_entropy=True))
    assert out.valid.tolist() == [[True] * 5 + [False] * 2, [True] * 7,
                                  [True] * 2 + [False] * 5]
    assert_nan_exactly_at_padding(out)
    np.testing.assert_allclose(out.logprobs[out.valid], -math.log(V), rtol=1e-5)
    np.testing.assert_allclose(out.entropy[out.valid], math.log(V), rtol=1e-5)


def test_speculative_logprobs_are_nan_exactly_past_each_rows_length(uniform):
    out = dl.speculative_generate(uniform, dl.NgramDrafter(), [[1, 2, 3], [1]],
                                  dl.SamplingParams(), 2, 10**9,
                                  options=dl.SpeculativeOptions(max_len=8, return_top_logprobs=2,
                                                                return_entropy=True))
    assert out.lengths.tolist() == [5, 7]
    assert_nan_exactly_at_padding(out)


def test_an_acceptance_rate_is_nan_exactly_where_nothing_was_tested():
    from decodelab.speculative.generation import SpeculativeStats

    stats = SpeculativeStats(gamma=2, rounds=np.array([2, 1]), generated=np.array([3, 1]),
                             tested_by_position=np.array([[2, 0], [0, 0]]),
                             accepted_by_position=np.array([[1, 0], [0, 0]]),
                             accepted_per_round=np.array([[1, 0, -1], [0, -1, -1]]))
    assert np.array_equal(np.isnan(stats.alpha), stats.tested == 0)
    assert stats.alpha[0] == 0.5
    assert np.array_equal(np.isnan(stats.acceptance_by_position), [False, True])
    assert stats.overall_alpha == 0.5
    nothing = dataclasses.replace(stats, tested_by_position=np.zeros((2, 2), int),
                                  accepted_by_position=np.zeros((2, 2), int))
    assert math.isnan(nothing.overall_alpha) and np.isnan(nothing.alpha).all()
