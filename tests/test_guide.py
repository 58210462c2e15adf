"""Classifier-free guidance and DoLa in ``generate`` (``DecodeOptions.guidance_scale``,
``negative_prompts``, ``dola_layers``; ``decode.guide``, ``decode.scoring``): the defining
properties, exact distributions against references, transformers' CFG, one program per static
choice, and the errors."""

import numpy as np
import pytest
import requires
from flax import nnx

import decodelab as dl
from decodelab.decode.guide import dola_candidates
from decodelab.decode.scoring import RELATIVE_TOP, dola_contrast, guided
from decodelab.measure import compiles
from tests.standins import Chain, NextToken, chain_logp

GREEDY = dl.SamplingParams.greedy()
# Prompts in one bucket (4) with negative prompts in the same bucket, so the prompt block and
# max_len are plain decoding's; EQUAL has each negative prompt as long as its prompt.
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [30, 31]]
NEGATIVES = [[9, 9], [100, 101, 102, 103], []]
EQUAL = [[200, 201, 202], [11, 12, 13, 14], [77, 78]]
SEEDS = [3, 8, 21]
# One sampler per row: greedy; temperature with top-k and a repetition penalty; top-p with min-p.
MIXED = dl.SamplingParams(temperature=[0.0, 0.8, 1.2], top_k=[0, 20, 0], top_p=[1.0, 1.0, 0.9],
                          min_p=[0.0, 0.0, 0.05], repetition_penalty=[1.0, 1.3, 1.0])
# Samplers that read nothing but the model's scores and the output (no prompt tokens).
OUTPUT_ONLY = dl.SamplingParams(temperature=[0.0, 0.8, 1.2], top_k=[0, 20, 0],
                                top_p=[1.0, 1.0, 0.9], frequency_penalty=[0.0, 0.5, 0.0])
TOP = 4  # top log-probabilities returned where distributions are compared


def cfg(scale, negatives=NEGATIVES, **more) -> dl.DecodeOptions:
    return dl.DecodeOptions(guidance_scale=scale, negative_prompts=negatives, **more)


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def deep(tiny_config):
    """4 layers, untied: DoLa has candidates below and above the middle, and an lm_head. The
    last block's output is scaled up 6 times: in a plain random model the embeddings are always
    the farthest exit from the final layer; here the farthest varies by row and step."""
    model = dl.Transformer(tiny_config.replace(n_layers=4, tie_embeddings=False),
                           rngs=nnx.Rngs(2))
    last = model.blocks[3]
    last.attn.o.kernel[...] = last.attn.o.kernel[...] * 6
    last.mlp.down.kernel[...] = last.mlp.down.kernel[...] * 6
    return model


# --- Classifier-free guidance ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
def test_guidance_1_is_plain_decoding_with_any_sampler(tiny, n):
    """The conditional rows share the batch with their unconditional twins and are unchanged by
    them: tokens as plain generate's, with n samples per prompt too."""
    plain = dl.generate(tiny, PROMPTS, MIXED, 12, seed=SEEDS, n=n,
                        options=dl.DecodeOptions(return_top_logprobs=TOP))
    guided_out = dl.generate(tiny, PROMPTS, MIXED, 12, seed=SEEDS, n=n,
                             options=cfg(1.0, return_top_logprobs=TOP))
    np.testing.assert_array_equal(guided_out.tokens, plain.tokens)
    np.testing.assert_allclose(guided_out.top_logprobs, plain.top_logprobs, rtol=0, atol=1e-5)
    assert guided_out.finish_reason == plain.finish_reason


def test_guidance_0_is_decoding_from_the_negative_prompt(tiny):
    """With scale 0 a row continues its negative prompt: the output is plain generate's from the
    negative prompts, token for token, where the sampling reads only the model's scores and the
    output (here every negative prompt is as long as its prompt, so the random streams, drawn at
    the row's position, and the budgets are the same; ``guide``'s docstring)."""
    from_negatives = dl.generate(tiny, EQUAL, OUTPUT_ONLY, 12, seed=SEEDS,
                                 options=dl.DecodeOptions(return_top_logprobs=TOP))
    out = dl.generate(tiny, PROMPTS, OUTPUT_ONLY, 12, seed=SEEDS,
                      options=cfg(0.0, EQUAL, return_top_logprobs=TOP))
    np.testing.assert_array_equal(out.tokens, from_negatives.tokens)
    np.testing.assert_allclose(out.top_logprobs, from_negatives.top_logprobs, rtol=0, atol=1e-5)
    plain = dl.generate(tiny, PROMPTS, OUTPUT_ONLY, 12, seed=SEEDS)
    assert (plain.tokens != out.tokens).any()  # the prompts matter: this compares something


def test_every_step_samples_the_guided_distribution_of_both_histories():
    """A second-order chain: at every step each row's sampling distribution is exactly
    ``log_softmax(lu + g (lc - lu))``, lc after the prompt and the output, lu after the negative
    prompt and the same output, for a different scale per row (one above 1, one below 0)."""
    V = 6
    table = np.random.default_rng(0).dirichlet(np.ones(V), size=(V, V))  # [V, V, V], no zeros
    prompts, negatives, scales = [[0, 1], [2, 3, 4]], [[5, 5, 2], [1]], [1.7, -0.5]
    out = dl.generate(Chain(table), prompts, dl.SamplingParams(temperature=1.0), 6, seed=[1, 2],
                      options=cfg(scales, negatives, return_top_logprobs=V))
    for row, (p, neg, g) in enumerate(zip(prompts, negatives, scales)):
        output = out.tokens[row].tolist()
        for i in range(6):
            lc = chain_logp(table, p + output[:i])
            lu = chain_logp(table, neg + output[:i])
            mixed = lu + g * (lc - lu)
            expected = mixed - np.logaddexp.reduce(mixed)
            np.testing.assert_allclose(out.top_logprobs[row, i], np.sort(expected)[::-1],
                                       rtol=0, atol=1e-5)


def test_a_row_ends_when_its_unconditional_stream_fills_the_cache():
    """A 10-token negative prompt beside a 2-token prompt in 16 slots: 6 tokens, then "length"
    (plain decoding of the prompt would have room for 14)."""
    options = cfg(2.0, [list(range(10, 20))], max_len=16)
    out = dl.generate(NextToken(vocab_size=32), [[1, 2]], GREEDY, 14, options=options)
    assert out.token_lists() == [[3, 4, 5, 6, 7, 8]] and out.finish_reason == ["length"]


def test_guidance_scales_at_0_and_1_pass_a_stream_through_and_a_failure_is_nan():
    cond = np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 1.0]],
                    np.float32)
    uncond = np.array([[3.0, 2.0, 1.0], [2.0, -2.0, 0.0], [0.0, np.nan, 0.0], [1.0, 0.0, 0.0]],
                      np.float32)
    out = np.asarray(guided(cond, uncond, np.array([1.0, 0.0, 1.0, 2.5], np.float32)))
    np.testing.assert_array_equal(out[0], cond[0])  # the model's own logits, not re-normalised
    np.testing.assert_array_equal(out[1], uncond[1])
    assert np.isnan(out[2]).all()  # a NaN in either stream is the model's failure
    lc, lu = (x - np.logaddexp.reduce(x) for x in (cond[3], uncond[3]))
    np.testing.assert_allclose(out[3], lu + 2.5 * (lc - lu), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def hf_twin(tiny):
    """transformers' LlamaForCausalLM with the tiny model's weights."""
    torch = requires.importorskip("torch", reason="the CFG peer is transformers (the test extra)")
    transformers = requires.importorskip("transformers", reason="the CFG peer (the test extra)")
    from decodelab.measure import peers

    transformers.logging.set_verbosity_error()
    twin = transformers.LlamaForCausalLM(peers.llama_config(tiny.config, 64)).eval()
    weights = {k: torch.from_numpy(v.copy()) for k, v in peers.llama_state_dict(tiny).items()}
    twin.load_state_dict(weights, strict=False)
    return twin


def test_greedy_guidance_matches_transformers_and_a_new_scale_compiles_nothing(tiny, hf_twin):
    """transformers' ``generate(guidance_scale=g, negative_prompt_ids=...)`` on the same weights,
    one prompt at a time (its default, no negative prompt, for the empty one); the scales after
    the first run decodelab's compiled programs again."""
    import torch

    dl.generate(tiny, PROMPTS, GREEDY, 10, options=cfg(2.0))  # the programs, compiled once
    for g in (1.5, 3.0, 0.5, -1.0):
        with compiles.count_compiles() as counts:
            ours = dl.generate(tiny, PROMPTS, GREEDY, 10, options=cfg(g))
        assert sum(counts.values()) == 0
        for p, neg, row in zip(PROMPTS, NEGATIVES, ours.token_lists()):
            negative = {"negative_prompt_ids": torch.tensor([neg])} if neg else {}
            with torch.no_grad():
                theirs = hf_twin.generate(torch.tensor([p]), do_sample=False, max_new_tokens=10,
                                          guidance_scale=g, pad_token_id=0, **negative)
            assert row == theirs[0, len(p):].tolist(), (g, p)


# --- DoLa -----------------------------------------------------------------------------------------


def reference_contrast(final: np.ndarray, early: np.ndarray) -> tuple[np.ndarray, int]:
    """NumPy DoLa for one row: final logits ``[V]``, early-exit logits ``[n, V]`` -> (scores
    ``[V]``, the candidate with the largest Jensen-Shannon divergence from the final layer)."""
    def log_softmax(x):
        return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)

    lf, le = log_softmax(final.astype(np.float64)), log_softmax(early.astype(np.float64))
    pf, pe = np.exp(lf), np.exp(le)
    m = (pf + pe) / 2
    jsd = 0.5 * np.sum(pf * (lf - np.log(m)), -1) + 0.5 * np.sum(pe * (le - np.log(m)), -1)
    j = int(np.argmax(jsd))
    scores = np.where(lf >= lf.max() + np.log(RELATIVE_TOP), lf - le[j], -np.inf)
    return scores, j


def test_dola_picks_the_layer_of_largest_jensen_shannon_divergence_per_row():
    """Rows built so that each of three candidates wins in some row: the choice and the contrast
    are the NumPy reference's, and a constraint takes the plausibility maximum over the tokens
    it allows."""
    rng = np.random.default_rng(0)
    final = rng.normal(size=(6, 50)).astype(np.float32) * 3
    early = rng.normal(size=(6, 3, 50)).astype(np.float32)
    for row in range(6):  # candidate row % 3 is far from the final layer, the others close
        early[row] = final[row] + 0.1 * early[row]
        early[row, row % 3] = -final[row]
    scores, chosen = dola_contrast(final, early)
    assert np.asarray(chosen).tolist() == [0, 1, 2, 0, 1, 2]
    for row in range(6):
        expected, j = reference_contrast(final[row], early[row])
        assert j == row % 3
        np.testing.assert_allclose(np.asarray(scores)[row], expected, rtol=0, atol=1e-5)
    allowed = np.zeros(50, bool)
    allowed[::2] = True
    masked = dola_contrast(final, early, lambda x: np.where(allowed, x, -np.inf))[0]
    lf = final - np.logaddexp.reduce(final, axis=-1, keepdims=True)
    best_allowed = lf[:, allowed].max(-1, keepdims=True)
    np.testing.assert_array_equal(np.isfinite(masked), lf >= best_allowed + np.log(RELATIVE_TOP))


@pytest.mark.parametrize("n_layers, tied, named, expected", [
    (2, True, "low", (1,)), (2, False, "low", (0,)), (4, True, "low", (2,)),
    (8, True, "low", (2,)), (8, False, "low", (0, 2)), (8, True, "high", (4, 6)),
    (1, True, "low", (0,)), (1, True, "high", (0,)), (32, True, "high", tuple(range(16, 32, 2))),
    (48, True, "low", tuple(range(2, 20, 2))), (48, False, "high", tuple(range(28, 48, 2))),
])
def test_named_dola_layers_map_as_transformers_did(n_layers, tied, named, expected):
    assert dola_candidates(named, n_layers, tied) == expected


def full_forward_dola(model, sequence: list[int], layers: tuple[int, ...], positions: range):
    """The DoLa scores after each prefix ``sequence[:p + 1]``, ``p`` in ``positions``, from one
    full forward without a cache (taps, then the model's head on each tap at that position; the
    model is causal, so position p sees only that prefix), each with the layer chosen."""
    logits, taps = model(np.asarray([sequence], np.int32), taps=layers)
    return [reference_contrast(np.asarray(logits[0, p]),
                               np.asarray(model.head(taps[None, :, 0, p]))[0])  # [n, V]
            for p in positions]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_dola_decoding_is_the_full_forward_reference_at_every_step(deep, sampled):
    """Each step's sampling distribution (temperature 1: the log-softmax of the contrast) is the
    reference's within 1e-5, and greedy tokens are the reference's argmax; the early exits come
    from the cached step's own taps, the reference's from a full forward."""
    layers = (0, 2)
    params = dl.SamplingParams(temperature=1.0 if sampled else 0.0)
    out = dl.generate(deep, PROMPTS, params, 8, seed=SEEDS,
                      options=dl.DecodeOptions(dola_layers=list(layers), return_top_logprobs=TOP))
    chosen = set()
    for row, prompt in enumerate(PROMPTS):
        output = out.tokens[row].tolist()
        P = len(prompt)
        steps = full_forward_dola(deep, prompt + output[:7], layers, range(P - 1, P + 7))
        for i, (scores, j) in enumerate(steps):
            chosen.add(j)
            if sampled:
                logp = scores - np.logaddexp.reduce(scores)
                np.testing.assert_allclose(out.top_logprobs[row, i], np.sort(logp)[::-1][:TOP],
                                           rtol=0, atol=1e-5)
            else:
                assert output[i] == int(np.argmax(scores))
    assert chosen == {0, 1}  # both candidates win somewhere: the choice is tested too


def test_dola_compiles_one_program_per_choice_of_layers(deep):
    """New prompts (same buckets), seeds and samplers reuse the DoLa program; new layers are a
    new program."""
    options = dl.DecodeOptions(dola_layers="low")
    dl.generate(deep, PROMPTS, GREEDY, 8, options=options)
    with compiles.count_compiles() as counts:
        dl.generate(deep, EQUAL, MIXED, 8, seed=5, options=options)
    assert sum(counts.values()) == 0
    with compiles.count_compiles() as counts:
        dl.generate(deep, EQUAL, MIXED, 8, seed=5, options=dl.DecodeOptions(dola_layers="high"))
    assert counts["_decode_loop"] == 1


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    (dl.DecodeOptions(guidance_scale=1.5), "negative_prompts must hold one token-id list per"),
    (cfg(1.5, [[1], [2]]), r"negative_prompts must hold one token-id list per prompt \(3"),
    (cfg(1.5, "abc"), "negative_prompts must hold one token-id list"),
    (dl.DecodeOptions(negative_prompts=NEGATIVES), "negative_prompts is for classifier-free"),
    (cfg(1.5, [[1], [2], [512]]), r"negative_prompts\[2\] holds token id 512"),
    (cfg(float("nan")), "guidance_scale must be a finite number, got nan"),
    (cfg("2"), "guidance_scale must be a finite number"),
    (cfg([1.0, 2.0]), r"guidance_scale must be one number or one per prompt \(3\), got 2"),
    (cfg([1.0, None, 2.0]), r"guidance_scale\[1\] must be a finite number"),
    (cfg(1.5, dola_layers="low"), "dola_layers cannot be combined with guidance_scale"),
    (cfg(1.5, [[1] * 20, [2], [3]], max_len=16), r"negative_prompts\[0\] has 20 tokens but max_len"),
    (dl.DecodeOptions(dola_layers="middle"), "dola_layers must be None, 'low', 'high' or"),
    (dl.DecodeOptions(dola_layers=[]), "dola_layers must be None, 'low', 'high' or"),
    (dl.DecodeOptions(dola_layers=[0, 0]), "distinct layer indices"),
    (dl.DecodeOptions(dola_layers=[-1]), "distinct layer indices >= 0, got"),
    (dl.DecodeOptions(dola_layers=[0, 2]), r"dola_layers must be layer indices in \[0, 2\) for"),
])
def test_bad_guidance_and_dola_options_name_the_field(tiny, options, message):
    with pytest.raises(ValueError, match=message):
        dl.generate(tiny, PROMPTS, GREEDY, 4, options=options)


def test_dola_needs_a_model_with_early_exits_and_a_candidate_layer(tiny_config):
    with pytest.raises(ValueError, match="dola_layers needs a model with early exits"):
        dl.generate(NextToken(), [[1]], GREEDY, 4, options=dl.DecodeOptions(dola_layers="low"))
    three = dl.Transformer(tiny_config.replace(n_layers=3), rngs=nnx.Rngs(0))  # tied
    with pytest.raises(ValueError, match="dola_layers='low' leaves no candidate layer"):
        dl.generate(three, [[1]], GREEDY, 4, options=dl.DecodeOptions(dola_layers="low"))


@pytest.mark.parametrize("options, name", [(cfg(1.5, [[1]]), "guidance_scale"),
                                           (dl.DecodeOptions(dola_layers="low"), "dola_layers")])
def test_speculative_generate_refuses_guidance_and_dola(options, name):
    with pytest.raises(ValueError, match=f"speculative_generate does not take {name}"):
        dl.speculative_generate(NextToken(), dl.NgramDrafter(), [[1]], GREEDY, 2, 4,
                                options=options)
