"""XTC, DRY and dynamic temperature against llama.cpp's own samplers (its ``llama_sampler_*``,
through ``llama-cpp-python``: the ``llamacpp`` extra), on the same logits and histories, over
SmolLM2's vocabulary on both sides (so DRY's string breakers find the same tokens): the kept set
is the same and the probabilities agree within 1e-6. Skipped where the extra or SmolLM2 is not
installed.

XTC is checked at probability 1 and 0 (decodelab's XTC is the exact mixture of the two, see
``truncation.Xtc``); DRY's ``dry_penalty_last_n=-1`` (the whole row) against llama.cpp's with a
window longer than the row (its -1 is the model's training context, which a vocabulary-only
load does not have).
"""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_llama_samplers import temp_ext

import decodelab as dl
from decodelab import sampling

llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra (compiles llama.cpp)")

ATOL = 1e-6
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


@pytest.fixture(scope="module")
def smollm2(smollm2_installed):
    """``(llama.cpp's vocabulary, decodelab's tokenizer)`` of SmolLM2's GGUF file."""
    from decodelab.convert import gguf_tokenizer
    from decodelab.experiment import presets

    path = presets.pretrained_path(smollm2_installed)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    yield llm, llama_cpp.llama_model_get_vocab(llm.model), gguf_tokenizer(path)
    llm.close()


def llama_apply(sampler, logits: np.ndarray) -> np.ndarray:
    """llama.cpp's ``sampler`` applied to ``[V]`` logits: the probabilities of what it keeps
    (softmax over its candidates, in float64), 0 elsewhere."""
    V = logits.shape[0]
    data = np.zeros(V, TOKEN_DATA)
    data["id"], data["logit"] = np.arange(V), logits
    array = llama_cpp.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=V,
        selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    start = (ctypes.cast(array.data, ctypes.c_void_p).value - data.ctypes.data) // TOKEN_DATA.itemsize
    kept = data[start:start + array.size]
    out = np.full(V, -np.inf)
    out[kept["id"]] = kept["logit"]
    llama_cpp.llama_sampler_free(sampler)
    return np.exp(out - np.logaddexp.reduce(out))


@jax.jit
def _processed(logits, params, history):
    return jnp.exp(sampling.processed_logprobs(logits, params, history))


def decodelab_probs(params: dl.SamplingParams, logits: np.ndarray, tokens=(), tokenizer=None):
    V = logits.shape[0]
    buffer = np.zeros((1, max(len(tokens), 1)), np.int32)
    buffer[0, :len(tokens)] = tokens
    history = sampling.History(tokens=jnp.asarray(buffer), prompt_lengths=jnp.zeros(1, jnp.int32),
                               lengths=jnp.full((1,), len(tokens), jnp.int32),
                               eos_mask=jnp.zeros((V,), bool))
    return np.asarray(_processed(logits[None], params.per_row(1, V, tokenizer=tokenizer),
                                 history))[0]


def agree(ours: np.ndarray, theirs: np.ndarray) -> None:
    np.testing.assert_array_equal(ours > 0, theirs > 0)  # the kept set
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)


def peaked_logits(V: int, seed: int) -> np.ndarray:
    """Noise with a handful of tokens well above it, so several reach XTC's thresholds."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=V).astype(np.float32)
    logits[rng.choice(V, 6, replace=False)] += np.array([12, 11.9, 11.5, 11, 10.5, 10], np.float32)
    return logits


@pytest.mark.parametrize("probability, threshold, seed", [
    (1.0, 0.05, 0), (1.0, 0.1, 1), (1.0, 0.2, 2), (1.0, 0.5, 3), (1.0, 0.0, 4), (0.0, 0.1, 5)])
def test_xtc_keeps_what_llama_cpp_keeps(smollm2, probability, threshold, seed):
    _, _, tokenizer = smollm2
    logits = peaked_logits(tokenizer.vocab_size, seed)
    theirs = llama_apply(llama_cpp.llama_sampler_init_xtc(probability, threshold, 0, seed), logits)
    ours = decodelab_probs(dl.SamplingParams(xtc_probability=probability,
                                             xtc_threshold=threshold), logits)
    agree(ours, theirs)
    assert probability == 0 or threshold >= 0.5 or (ours == 0).any()  # some top choice went


def test_xtc_after_top_k_and_min_p_is_llama_cpps_chain(smollm2):
    _, _, tokenizer = smollm2
    logits = peaked_logits(tokenizer.vocab_size, 6)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for s in (llama_cpp.llama_sampler_init_top_k(40), llama_cpp.llama_sampler_init_min_p(1e-4, 1),
              llama_cpp.llama_sampler_init_xtc(1.0, 0.1, 0, 0)):
        llama_cpp.llama_sampler_chain_add(chain, s)
    theirs = llama_apply(chain, logits)
    ours = decodelab_probs(dl.SamplingParams(top_k=40, min_p=1e-4, xtc_probability=1.0), logits)
    agree(ours, theirs)
    assert 1 < (ours > 0).sum() < 40


@pytest.mark.parametrize("temperature, spread, exponent", [
    (1.0, 0.5, 1.0), (0.8, 0.3, 2.0), (0.5, 1.0, 0.5), (1.5, 1.5, 1.0), (0.7, 0.2, 0.0)])
def test_dynamic_temperature_is_llama_cpps_temp_ext(smollm2, temperature, spread, exponent):
    """Within 1e-6 of llama.cpp's on 512 tokens, and of the definition in float64 on SmolLM2's
    49152; there llama.cpp's own float32 running sums (softmax, entropy) move its
    probabilities by up to ~5e-5 on a peaked distribution, so it is held to 1e-4."""
    _, _, tokenizer = smollm2
    for V, seed, scale in ((512, 0, 1.0), (512, 1, 4.0), (tokenizer.vocab_size, 2, 1.0),
                           (tokenizer.vocab_size, 3, 4.0)):  # flat and peaked distributions
        logits = (np.random.default_rng(seed).normal(size=V) * scale).astype(np.float32)
        theirs = llama_apply(llama_cpp.llama_sampler_init_temp_ext(temperature, spread,
                                                                   exponent), logits)
        ours = decodelab_probs(dl.SamplingParams(temperature=temperature, dynatemp_range=spread,
                                                 dynatemp_exponent=exponent), logits)
        np.testing.assert_allclose(ours, temp_ext(logits, temperature, spread, exponent),
                                   rtol=0, atol=ATOL)
        np.testing.assert_array_equal(ours > 0, theirs > 0)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL if V == 512 else 1e-4)
        plain = decodelab_probs(dl.SamplingParams(temperature=temperature), logits)
        assert np.abs(ours - plain).max() > 1e-4  # the range did something


def dry_history(tokenizer, seed: int, length: int) -> list[int]:
    """Tokens from a small pool with the breakers in it, so repeats of every length (and
    repeats cut by a breaker) come up."""
    rng = np.random.default_rng(seed)
    words = [tokenizer.encode(w)[0] for w in (" the", " cat", " sat", " on", " mat", " a")]
    breakers = [tokenizer.encode(b)[0] for b in ("\n", ":")]
    phrase = list(rng.choice(words, 5))
    tokens: list[int] = []
    while len(tokens) < length:
        pick = rng.random()
        tokens += (phrase if pick < 0.4 else [int(rng.choice(breakers))] if pick < 0.5
                   else [int(rng.choice(words))])
    return [int(t) for t in tokens[:length]]


@pytest.mark.parametrize("multiplier, base, allowed, last_n", [
    (0.8, 1.75, 2, -1), (1.0, 2.0, 1, 16), (0.5, 1.1, 3, 24), (2.0, 3.0, 2, 40)])
def test_dry_penalises_what_llama_cpps_dry_penalises(smollm2, multiplier, base, allowed, last_n):
    _, vocab, tokenizer = smollm2
    V = tokenizer.vocab_size
    strings = [b"\n", b":", b"\"", b"*"]
    penalised = 0
    for seed in range(4):
        tokens = dry_history(tokenizer, seed, 48)
        logits = np.random.default_rng(seed).normal(size=V).astype(np.float32)
        sampler = llama_cpp.llama_sampler_init_dry(
            vocab, multiplier, base, allowed, 4096 if last_n == -1 else last_n,
            (ctypes.c_char_p * 4)(*strings), 4)
        for token in tokens:
            llama_cpp.llama_sampler_accept(sampler, token)
        theirs = llama_apply(sampler, logits)
        params = dl.SamplingParams(dry_multiplier=multiplier, dry_base=base,
                                   dry_allowed_length=allowed, dry_penalty_last_n=last_n)
        ours = decodelab_probs(params, logits, tokens, tokenizer)
        agree(ours, theirs)
        penalised += int(np.sum(np.abs(theirs - np.exp(logits) / np.exp(logits).sum()) > 1e-7))
    assert penalised > 0  # the histories made llama.cpp penalise something
