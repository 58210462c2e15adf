"""Parameters stored in 16 bits: ``ModelConfig.param_dtype`` and ``quantize(weights="bfloat16" |
"float16")`` (``decodelab.model.layers`` states what is stored and how it is computed with)."""

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
from flax import nnx

import decodelab as dl
from decodelab.text import data
from decodelab.compress import dequantized, describe, parameter_bytes
from decodelab.serving import Request, SlotEngine
from decodelab.train import TrainConfig, train

HALVES = ("bfloat16", "float16")
PROMPTS = [[1, 2, 3, 4], [5, 6]]
GREEDY = dl.SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def halves(model):
    """Each 16-bit kind -> (the model stored in it, the float32 model holding its values)."""
    out = {}
    for kind in HALVES:
        half = dl.quantize(model, weights=kind)
        out[kind] = half, dequantized(half)
    return out


@pytest.fixture(scope="module")
def tokens(tiny_config):
    return jax.random.randint(jax.random.key(1), (2, 24), 0, tiny_config.vocab_size, jnp.int32)


def params(model):
    return nnx.state(model, nnx.Param)


def test_param_dtype_is_checked_by_the_config(tiny_config):
    with pytest.raises(ValueError, match=r"param_dtype must be one of \('float32', 'bfloat16', "
                                         r"'float16'\), got 'int8'"):
        tiny_config.replace(param_dtype="int8")


@pytest.mark.parametrize("kind", HALVES)
def test_a_model_built_with_param_dtype_stores_matrices_in_it_and_norms_in_float32(
        tiny_config, kind):
    model = dl.Transformer(tiny_config.replace(param_dtype=kind), rngs=nnx.Rngs(0))
    for path, leaf in nnx.to_flat_state(params(model)):
        norm = any("norm" in str(name) for name in path)
        assert leaf.dtype == (jnp.float32 if norm else jnp.dtype(kind)), path


@pytest.mark.parametrize("kind", HALVES)
def test_16_bit_storage_halves_every_parameter_but_the_norms(model, halves, kind):
    half, _ = halves[kind]
    norms = sum(leaf.nbytes for path, leaf in nnx.to_flat_state(params(model))
                if any("norm" in str(name) for name in path))
    nbytes = lambda m: sum(leaf.nbytes for leaf in jax.tree.leaves(params(m)))  # noqa: E731
    assert nbytes(half) == (nbytes(model) - norms) // 2 + norms
    assert parameter_bytes(half) == nbytes(half)
    assert half.config == model.config.replace(param_dtype=kind)


@pytest.mark.parametrize("kind", HALVES)
def test_stored_values_are_the_cast_and_logits_are_those_of_float32_holding_them(
        model, halves, tokens, kind):
    half, rounded = halves[kind]
    for a, b in zip(jax.tree.leaves(params(model)), jax.tree.leaves(params(half))):
        np.testing.assert_array_equal(np.asarray(a.astype(b.dtype)).view(np.uint8),
                                      np.asarray(b).view(np.uint8))
    logits = half(tokens)
    np.testing.assert_allclose(logits, rounded(tokens), rtol=0, atol=1e-6)
    # Rounding the weights moves the logits (std ~1) by bfloat16's or float16's precision.
    tolerance = {"bfloat16": 0.1, "float16": 0.01}[kind]
    np.testing.assert_allclose(logits, model(tokens), rtol=0, atol=tolerance)


@pytest.mark.parametrize("kind", HALVES)
def test_generate_greedy_and_sampled_equal_the_float32_model_holding_the_rounded_weights(
        halves, kind):
    half, rounded = halves[kind]
    for params_ in (GREEDY, dl.SamplingParams(temperature=1.0, top_k=20)):
        out = dl.generate(half, PROMPTS, params_, max_new_tokens=6, seed=3)
        assert out.token_lists() == dl.generate(rounded, PROMPTS, params_, max_new_tokens=6,
                                                seed=3).token_lists()


def test_beam_search_speculative_and_the_slot_engine_run_16_bit_models(model, halves):
    bf16, rounded = halves["bfloat16"]
    expected = dl.generate(rounded, PROMPTS, GREEDY, max_new_tokens=5, seed=0).token_lists()
    assert dl.beam_search(bf16, PROMPTS, 1, max_new_tokens=5).best() == expected
    # Draft and target stored differently: greedy speculation gives the target's tokens.
    spec = dl.speculative_generate(bf16, halves["float16"][0], PROMPTS, GREEDY, gamma=2,
                                   max_new_tokens=5, seed=0)
    assert spec.token_lists() == expected
    requests = [Request(id=i, prompt=p, max_new_tokens=5, params=GREEDY, seed=0)
                for i, p in enumerate(PROMPTS)]
    done = SlotEngine(bf16, 2, 32).run(requests)
    assert [done[i].tokens for i in range(len(PROMPTS))] == expected


def test_quantize_refuses_arguments_that_do_not_apply_to_a_cast(model, tokens):
    for kwargs in (dict(group_size=32), dict(method="gptq", calibration=tokens),
                   dict(scheme="minmax"), dict(activations="int8"), dict(embeddings=False)):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"^{name} does not apply to weights='bfloat16'"):
            dl.quantize(model, weights="bfloat16", **kwargs)


def test_a_16_bit_model_is_quantized_again_from_float32_with_a_warning(model, halves):
    bf16, rounded = halves["bfloat16"]
    with pytest.warns(UserWarning, match=r"already quantized \(bfloat16 parameters\)"):
        int8 = dl.quantize(bf16, weights="int8")
    assert int8.config.param_dtype == "float32"
    expected = dl.quantize(rounded, weights="int8")
    for a, b in zip(jax.tree.leaves(params(int8)), jax.tree.leaves(params(expected))):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.warns(UserWarning, match=r"already quantized \(int8 in"):
        back = dl.quantize(int8, weights="float16")
    assert back.config.param_dtype == "float16"
    assert not describe(back)


def test_prune_and_training_refuse_16_bit_parameters(halves, tiny_config):
    with pytest.raises(ValueError, match=r"float model for prune, got a quantized one "
                                         r"\(bfloat16 parameters\)"):
        dl.prune(halves["bfloat16"][0], sparsity=0.5)
    stream = np.zeros(256, np.int32)
    with pytest.raises(ValueError, match="model_cfg.param_dtype must be 'float32' for training"):
        train(tiny_config.replace(param_dtype="bfloat16"), TrainConfig(steps=1, warmup_steps=0), stream)


def test_checkpoint_round_trip_keeps_the_dtype_and_the_bits(tmp_path, halves, tokens):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(data.split_documents("train")["hamlet"], encoding="utf-8")
    bf16, _ = halves["bfloat16"]
    tokenizer = dl.Tokenizer.train([corpus], vocab_size=bf16.config.vocab_size, model_type="bpe")
    dl.save_checkpoint(tmp_path / "ckpt", bf16, tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "ckpt")
    assert loaded.config == bf16.config
    for a, b in zip(jax.tree.leaves(params(bf16)), jax.tree.leaves(params(loaded))):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    np.testing.assert_array_equal(loaded(tokens), bf16(tokens))


def test_a_compiled_decode_step_takes_its_weights_in_16_bits_and_converts_each_once(
        tiny_config, halves):
    """The step's weight matrices enter as bfloat16 parameters. On XLA CPU each one is converted
    to float32 by a fusion of its own that feeds the dot (``decodelab.model.layers``): the step's
    temporary bytes grow over the float32 model's by at most one float32 copy of each 16-bit
    matrix, never more (no conversion repeated per use)."""
    def step_of(model):
        graphdef, state = nnx.split(model)
        step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s)(t, cache=c))
        cache = dl.KVCache.init(tiny_config, batch_size=1, max_len=16)
        return step, (state, jnp.zeros((1, 1), jnp.int32), cache)

    bf16, rounded = halves["bfloat16"]
    step, args = step_of(bf16)
    text = step.lower(*args).compile().as_text()
    inputs = [line for line in text[text.index("ENTRY"):].splitlines() if "parameter(" in line]
    matrices = [leaf for leaf in jax.tree.leaves(params(bf16)) if leaf.ndim >= 2]
    for leaf in matrices:
        shape = ",".join(map(str, leaf.shape))
        assert any(f"= bf16[{shape}]" in line for line in inputs)
        assert not any(f"= f32[{shape}]" in line for line in inputs)
    converted = sum(leaf.size * 4 for leaf in matrices)
    float_step, float_args = step_of(rounded)
    temp = programs.compiled_memory(step, *args).temp_size_in_bytes
    assert temp <= programs.compiled_memory(float_step, *float_args).temp_size_in_bytes + converted
