"""dl.quantize: weights stored as int8 / int4 values with per-group scales; the quantized model
runs wherever the float one does and equals the float model that holds its dequantized kernels."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
from flax import nnx
from standins import TINY

import decodelab as dl
from decodelab.compress import qlinear
from decodelab.compress.qlinear import QuantizedEinsum, QuantizedEmbed
from decodelab.compress.quantization import dequantized, describe
from decodelab.text import data

GREEDY = dl.SamplingParams.greedy()
PROMPTS = [[5, 9, 13], [7, 1, 2, 3, 4, 8]]


@pytest.fixture(scope="module")
def cfg():
    return dl.ModelConfig(position="rope", **TINY)


@pytest.fixture(scope="module")
def model(cfg):
    return dl.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 16), 0, TINY["vocab_size"], jnp.int32)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, model):
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text(data.split_documents("train")["hamlet"], encoding="utf-8")
    return dl.Tokenizer.train([corpus], vocab_size=model.config.vocab_size, model_type="bpe")


@pytest.fixture(scope="module")
def int8(model):
    return dl.quantize(model, weights="int8")


@pytest.fixture(scope="module")
def int4(model):
    return dl.quantize(model, weights="int4", group_size=32)


@pytest.fixture(scope="module")
def forward():
    """A jitted ``(model, tokens, cache) -> (logits, cache)``, shared by the tests."""

    @jax.jit
    def run(graphdef_state, tokens, cache):
        graphdef, state = graphdef_state
        return nnx.merge(graphdef, state)(tokens, cache=cache)

    def call(model, tokens, cache=None):
        if cache is None:
            return nnx.jit(lambda m, t: m(t))(model, tokens)
        graphdef, state = nnx.split(model)
        return run((graphdef, state), tokens, cache)

    return call


def quantized_modules(model):
    return {path: m for path, m in nnx.iter_modules(model) if isinstance(m, QuantizedEinsum)}


# Tiny config: per layer q [64, 64], k [64, 32], v [64, 32], o [64, 64] (In = N * H = 64), gate and
# up [64, 256], down [256, 64]: 61440 weights and 768 output channels; 2 layers; norms 2 * 64 per
# layer plus 64; the tied table 512 * 64 stays float32.
FLOAT_REST = 512 * 64 * 4 + 2 * 128 * 4 + 64 * 4


def test_float_parameter_bytes_count_every_parameter_at_4_bytes(model):
    assert dl.parameter_bytes(model) == (dl.param_count(model)) * 4 == 623872


def test_int8_per_channel_stores_one_byte_per_weight_and_a_float_scale_per_output(int8):
    assert dl.parameter_bytes(int8) == FLOAT_REST + 2 * (61440 + 768 * 4)
    for m in quantized_modules(int8).values():
        assert m.qvalue.dtype == jnp.int8 and m.scale.shape[0] == 1 and m.offset is None


def test_int4_g32_stores_half_a_byte_per_weight_and_a_scale_per_32_inputs(int4):
    # groups x outputs: q 2 x 64, k 2 x 32, v 2 x 32, o 2 x 64, gate and up 2 x 256, down 8 x 64
    scales = 128 + 64 + 64 + 128 + 512 + 512 + 512
    assert dl.parameter_bytes(int4) == FLOAT_REST + 2 * (61440 // 2 + scales * 4)
    modules = quantized_modules(int4)
    assert len(modules) == 14
    assert all(m.qvalue.dtype == jnp.int4 and m.group_size == 32 for m in modules.values())


def test_embeddings_stay_float_unless_asked(model, int8):
    assert isinstance(int8.embed, nnx.Embed)
    with_table = dl.quantize(model, weights="int8", embeddings=True)
    assert isinstance(with_table.embed, QuantizedEmbed)
    assert with_table.embed.qvalue.shape == (64, 512)  # [D, V]: groups run along D
    assert dl.parameter_bytes(with_table) == (dl.parameter_bytes(int8) - 512 * 64 * 4
                                              + 512 * 64 + 512 * 4)


@pytest.mark.parametrize("scheme", ["absmax", "minmax"])
def test_each_weight_is_within_half_a_scale_of_its_dequantized_value(model, scheme):
    q = dl.quantize(model, weights="int4", group_size=32, scheme=scheme)
    floats = dict(nnx.iter_modules(model))
    for path, m in quantized_modules(q).items():
        w = np.asarray(floats[path].kernel[...]).reshape(m.qvalue.shape)  # [In, Out]
        scale = np.repeat(np.asarray(m.scale[...]), 32, axis=0)  # [In, Out]
        error = np.abs(w - np.asarray(m.kernel()).reshape(w.shape))
        assert (error <= scale / 2 * (1 + 1e-5)).all(), path
        assert (m.offset is not None) == (scheme == "minmax")
        values = np.asarray(m.qvalue[...], np.int32)
        assert values.min() >= -8 and values.max() <= 7


def test_grouped_matmul_equals_the_float_model_holding_the_dequantized_kernels(
        model, int4, tokens, forward):
    minmax = dl.quantize(model, weights="int4", group_size=32, scheme="minmax", embeddings=True)
    for q in (int4, minmax):
        np.testing.assert_allclose(forward(q, tokens), forward(dequantized(q), tokens),
                                   atol=1e-5, rtol=1e-5)


# Blocks of 2048 weights: each projection of the tiny model is dequantized a few columns at a time
# (q [64, 64] in 2 blocks of 32 columns, gate [64, 256] in 8 of 32, down [256, 64] in 8 of 8).
SMALL_BLOCK = 32 * 64
LARGEST_KERNEL = 64 * 256  # gate, up and down: one block each at block_elements >= this


def test_blocked_matmul_equals_the_float_model_holding_the_dequantized_kernels(
        model, int4, tokens, forward):
    small = qlinear.with_block_elements(int4, SMALL_BLOCK)
    blocks = {path[-1]: m.columns_per_block() for path, m in quantized_modules(small).items()}
    assert blocks == {"q": 32, "k": 32, "v": 32, "o": 32, "gate": 32, "up": 32, "down": 8}
    # A copy: the original keeps one block per kernel (all its columns).
    assert {m.columns_per_block() for m in quantized_modules(int4).values()} == {32, 64, 256}
    minmax = qlinear.with_block_elements(dl.quantize(model, weights="int8", scheme="minmax"),
                                         SMALL_BLOCK)
    for q in (small, minmax):
        np.testing.assert_allclose(forward(q, tokens), forward(dequantized(q), tokens),
                                   atol=1e-5, rtol=1e-5)


def decode_step(cfg, q):
    """``(step, args)``: one cached decode step of ``q`` over a batch of one token."""
    graphdef, state = nnx.split(q)
    step = jax.jit(lambda state, tokens, cache: nnx.merge(graphdef, state)(tokens, cache=cache))
    return step, (state, jnp.zeros((1, 1), jnp.int32), dl.KVCache.init(cfg, batch_size=1,
                                                                          max_len=16))


def dequantized_sizes(step, args) -> list[int]:
    """The element counts of the float arrays the step converts integer (int8 / int4) weight
    matrices into."""
    return [programs.elements(e.output_types[0]) for e in programs.equations(step, *args)
            if e.primitive == "convert_element_type" and e.input_types[0].ndim == 2
            and e.input_types[0].dtype in (jnp.int8, jnp.int4)
            and jnp.issubdtype(e.output_types[0].dtype, jnp.floating)]


@pytest.mark.parametrize("weights, group_size, activations, embeddings", [
    ("int8", None, None, False), ("int4", 32, None, False), ("int8", 32, "int8", False),
    ("int8", 32, "int8x2", False), ("int8", 32, None, True)])
def test_a_decode_step_never_forms_a_float_kernel_larger_than_a_block(
        cfg, model, weights, group_size, activations, embeddings):
    """The step dequantizes one block at a time, and its compiled form does not keep the whole
    dequantized kernels either: its temporary bytes are smaller than with one block per kernel by
    more than the largest kernel's float32 bytes. So does W8A8 in blocks of 32 (its rounded
    inputs go through the same blocked matmul), and the head when it is quantized too."""
    q = dl.quantize(model, weights=weights, group_size=group_size, activations=activations,
                    embeddings=embeddings)
    blocked = decode_step(cfg, qlinear.with_block_elements(q, SMALL_BLOCK))
    sizes = dequantized_sizes(*blocked)
    assert sizes and max(sizes) <= SMALL_BLOCK
    whole = decode_step(cfg, qlinear.with_block_elements(q, LARGEST_KERNEL))
    assert max(dequantized_sizes(*whole)) == LARGEST_KERNEL
    saved = (programs.compiled_memory(*whole[:1], *whole[1]).temp_size_in_bytes
             - programs.compiled_memory(*blocked[:1], *blocked[1]).temp_size_in_bytes)
    assert saved > 4 * LARGEST_KERNEL


@pytest.mark.parametrize("quantized", ["int4", "w8a8"])
def test_quantized_cache_path_matches_the_full_forward(cfg, quantized, tokens, forward, request):
    model = request.getfixturevalue(quantized)  # W8A8: each token's row is rounded on its own
    full = forward(model, tokens)
    cache = dl.KVCache.init(cfg, batch_size=2, max_len=16)
    prefill, cache = forward(model, tokens[:, :10], cache)
    steps = [prefill]
    for t in range(10, 16):
        logits, cache = forward(model, tokens[:, t:t + 1], cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5)


def test_generate_with_a_quantized_model_is_the_greedy_argmax_of_its_logits(int4, forward):
    out = dl.generate(int4, PROMPTS, GREEDY, max_new_tokens=4, seed=0).token_lists()
    for prompt, new in zip(PROMPTS, out):
        logits = forward(int4, jnp.asarray([prompt + new], jnp.int32))[0]  # [T, V]
        P = len(prompt)
        assert new == jnp.argmax(logits[P - 1:P - 1 + len(new)], axis=-1).tolist()


@pytest.mark.parametrize("quantized", ["int8", "w8a8"])
def test_greedy_speculative_with_a_quantized_target_equals_greedy_generate(quantized, int4,
                                                                           request):
    target = request.getfixturevalue(quantized)
    expected = dl.generate(target, PROMPTS, GREEDY, max_new_tokens=8, seed=0).token_lists()
    spec = dl.speculative_generate(target, int4, PROMPTS, GREEDY, gamma=3, max_new_tokens=8,
                                   seed=0)
    assert spec.token_lists() == expected


def test_beam_search_of_width_one_with_a_quantized_model_is_greedy(int4):
    expected = dl.generate(int4, PROMPTS, GREEDY, max_new_tokens=4, seed=0).token_lists()
    beams = dl.beam_search(int4, PROMPTS, 1, max_new_tokens=4).best()
    assert beams == expected


def test_checkpoint_round_trip_keeps_the_stored_values(tmp_path, model, tokenizer, tokens,
                                                       forward):
    q = dl.quantize(model, weights="int4", group_size=32, scheme="minmax", embeddings=True)
    dl.save_checkpoint(tmp_path / "ckpt", q, tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "ckpt")
    saved, restored = nnx.state(q, nnx.Param), nnx.state(loaded, nnx.Param)
    assert jax.tree.map(lambda a: a.dtype, saved) == jax.tree.map(lambda a: a.dtype, restored)
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    np.testing.assert_array_equal(forward(loaded, tokens), forward(q, tokens))


def test_a_checkpoint_keeps_the_block_size_and_a_bad_one_is_refused(tmp_path, int4, tokenizer):
    dl.save_checkpoint(tmp_path / "ckpt", qlinear.with_block_elements(int4, SMALL_BLOCK), tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "ckpt")
    assert {m.block_elements for m in quantized_modules(loaded).values()} == {SMALL_BLOCK}
    with pytest.raises(ValueError, match="^block_elements must be an int >= 1, got 0$"):
        qlinear.with_block_elements(int4, 0)
    with pytest.raises(ValueError, match="model must have quantized layers for "
                                         "with_block_elements"):
        qlinear.with_block_elements(dequantized(int4), SMALL_BLOCK)


def test_checkpoint_round_trip_keeps_integer_activations(tmp_path, w8a8, tokenizer, tokens,
                                                         forward):
    dl.save_checkpoint(tmp_path / "ckpt", w8a8, tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "ckpt")
    assert {m.activations for m in quantized_modules(loaded).values()} == {"int8"}
    np.testing.assert_array_equal(forward(loaded, tokens), forward(w8a8, tokens))


def integer_activations_reference(module, x, terms=1):
    """NumPy integer activations of one quantized module on ``x [R, In]`` (float64): each row's
    inputs of one weight group (the whole row for one scale per output channel) rounded to int8
    with their own absmax scale, then (``terms=2``) the remainder rounded the same way, the
    terms' sum times the dequantized kernel."""
    R, In = x.shape
    G = module.scale.shape[0]
    rest, approx = np.asarray(x, np.float64).reshape(R, G, In // G), 0.0
    for _ in range(terms):
        absmax = np.abs(rest).max(axis=2, keepdims=True)
        group_scale = np.where(absmax > 0, absmax / 127, 1.0)
        term = np.clip(np.round(rest / group_scale), -127, 127) * group_scale
        approx, rest = approx + term, rest - term
    kernel = np.asarray(module.kernel(), np.float64).reshape(module.qvalue.shape)
    return approx.reshape(R, In) @ kernel


@pytest.fixture(scope="module")
def w8a8(model):
    return dl.quantize(model, weights="int8", activations="int8")


@pytest.fixture(scope="module")
def int8x2(model):
    return dl.quantize(model, weights="int8", activations="int8x2")


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("activations", ["int8", "int8x2"])
def test_integer_activations_equal_weight_groups_rounded_to_int8_times_the_kernel(
        model, request, rows, activations):
    """Each row's inputs of one weight group get their own int8 scale (the whole row for one
    scale per output channel; 32 inputs for int8 in blocks of 32, as llama.cpp's Q8_0 x Q8_0)."""
    terms = qlinear.ACTIVATION_TERMS[activations]
    per_channel = request.getfixturevalue({"int8": "w8a8", "int8x2": "int8x2"}[activations])
    blocks = dl.quantize(model, weights="int8", group_size=32, activations=activations)
    minmax = dl.quantize(model, weights="int4", group_size=32, scheme="minmax",
                         activations=activations)
    for q in (per_channel, blocks, minmax):
        for path, module in quantized_modules(q).items():
            x = jax.random.normal(jax.random.key(rows), (rows, *module.in_dims), jnp.float32)
            got = nnx.jit(lambda m, x: m(x))(module, x).reshape(rows, -1)
            np.testing.assert_allclose(
                got, integer_activations_reference(module, x.reshape(rows, -1), terms),
                rtol=1e-5, atol=1e-5, err_msg=".".join(map(str, path)))


def test_two_int8_terms_round_activations_far_finer_than_one(model, w8a8, int8x2):
    """int8x2's output is within 1/100 of W8A8's error of the float kernel's (module docstring:
    the remainder's rounding is 127 times finer)."""
    for (path, one), two in zip(quantized_modules(w8a8).items(),
                                quantized_modules(int8x2).values(), strict=True):
        x = jax.random.normal(jax.random.key(2), (3, *one.in_dims), jnp.float32)
        exact = np.asarray(x, np.float64).reshape(3, -1) @ np.asarray(
            one.kernel(), np.float64).reshape(one.qvalue.shape)
        errors = [np.abs(nnx.jit(lambda m, x: m(x))(m, x).reshape(3, -1) - exact).max()
                  for m in (one, two)]
        assert errors[1] < errors[0] / 100, ".".join(map(str, path))


@pytest.mark.parametrize("quantized, rows", [("w8a8", 2), ("int8x2", 2)])
def test_an_integer_activations_step_multiplies_int8_by_int8_and_never_dequantizes(
        cfg, request, quantized, rows):
    """Every projection is an int8 x int8 dot into int32 of two rows (W8A8: one row padded to 2;
    int8x2: the row's two terms); no integer weight becomes a float array (only activation rows
    do), and the compiled step's temporary bytes stay below one float32 copy of the largest
    kernel."""
    step, args = decode_step(cfg, request.getfixturevalue(quantized))
    equations = programs.equations(step, *args)
    integer_dots = [e for e in equations if e.primitive == "dot_general"
                    and [t.dtype for t in e.input_types] == [jnp.int8, jnp.int8]
                    and e.output_types[0].dtype == jnp.int32
                    and e.input_types[0].shape[0] == rows]
    assert len(integer_dots) == 7 * cfg.n_layers  # q, k, v, o, gate, up, down
    converted = [e.input_types[0].shape for e in equations
                 if e.primitive == "convert_element_type"
                 and e.input_types[0].dtype in (jnp.int8, jnp.int4)
                 and jnp.issubdtype(e.output_types[0].dtype, jnp.floating)]
    assert all(shape[0] == 1 for shape in converted)  # a decoded token's activation row
    assert programs.compiled_memory(step, *args).temp_size_in_bytes < 4 * LARGEST_KERNEL


def output_error(float_model, q, calibration):
    """Sum over projections of ||X W - X W_q||^2 on the projections' calibration inputs."""
    from decodelab.compress.quantization import calibrate, projections

    hessians = calibrate(float_model, projections(float_model, False), "gptq", calibration)
    floats = dict(nnx.iter_modules(float_model))
    total = 0.0
    for path, m in quantized_modules(q).items():
        delta = (np.asarray(floats[path].kernel[...]).reshape(m.qvalue.shape)
                 - np.asarray(m.kernel()).reshape(m.qvalue.shape))  # [In, Out]
        total += float(np.einsum("io,ij,jo->", delta, np.asarray(hessians[path]), delta))
    return total


def test_gptq_and_awq_lower_the_calibration_output_error_of_round_to_nearest(model, tokens):
    rtn = dl.quantize(model, weights="int4", group_size=32)
    gptq = dl.quantize(model, weights="int4", group_size=32, method="gptq", calibration=tokens)
    awq = dl.quantize(model, weights="int4", group_size=32, method="awq", calibration=tokens)
    assert all(m.input_scale is not None for m in quantized_modules(awq).values())
    baseline = output_error(model, rtn, tokens)
    assert output_error(model, gptq, tokens) < 0.8 * baseline
    assert output_error(model, awq, tokens) <= baseline


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights="int3"), "weights must be one of ('int8', 'int4', 'bfloat16', 'float16'), "
                            "got 'int3'"),
    (dict(weights="int4", group_size=48), "group_size must divide the input dimension"),
    (dict(weights="int4", group_size=0), "group_size must be None or a positive int"),
    (dict(weights="int4", method="gptq"), "calibration must be a token array [B, T] for "
                                          "method='gptq'"),
    (dict(weights="int4", method="hqq"), "method must be one of ('rtn', 'gptq', 'awq')"),
    (dict(weights="int4", scheme="mse"), "scheme must be one of ('absmax', 'minmax')"),
    (dict(activations="int4"), "activations must be one of (None, 'int8', 'int8x2'), got "
                               "'int4'"),
])
def test_bad_arguments_name_the_argument_and_what_is_allowed(model, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dl.quantize(model, **kwargs)


# Quantizing a quantized model (decodelab.compress's table): redone from its dequantized weights,
# with a warning naming the old kind; every projection holds the new kind, none the old.
@pytest.mark.parametrize("source, old, kwargs", [
    ("int8", "int8", dict(weights="int4", group_size=32)),
    ("int4", "int4", dict(weights="int8")),
    ("int8", "int8", dict(weights="int8", activations="int8")),
    ("w8a8", "int8", dict(weights="int8", scheme="minmax")),
    ("int8", "int8", dict(weights="int4", group_size=32, embeddings=True)),
    ("int4", "int4", dict(weights="int4", group_size=32, method="gptq")),
])
def test_quantizing_a_quantized_model_redoes_it_from_its_dequantized_weights(request, tokens,
                                                                             source, old, kwargs):
    quantized = request.getfixturevalue(source)
    if kwargs.get("method") == "gptq":
        kwargs = {**kwargs, "calibration": tokens}
    with pytest.warns(UserWarning, match=re.escape(
            f"model is already quantized ({old} in 14 projections); quantizing its dequantized "
            f"weights to weights={kwargs['weights']!r}")):
        again = dl.quantize(quantized, **kwargs)
    expected = dl.quantize(dequantized(quantized), **kwargs)
    spec = describe(again)
    assert spec == describe(expected)
    assert len(spec) == 14 + kwargs.get("embeddings", False)
    assert {s["qvalue"] for s in spec.values()} == {kwargs["weights"]}
    assert {s["activations"] for s in spec.values()} == {kwargs.get("activations")}
    for got, want in zip(jax.tree.leaves(nnx.state(again)), jax.tree.leaves(nnx.state(expected)),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_refused_group_size_is_named_before_a_quantized_model_is_dequantized(int8):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before the re-quantization warns
        with pytest.raises(ValueError, match=re.escape("group_size must divide the input "
                                                       "dimension of every quantized projection; "
                                                       "blocks.0.attn.k has 64 inputs")):
            dl.quantize(int8, weights="int4", group_size=48)


@pytest.mark.parametrize("changes, message", [
    (dict(qvalue=(4,)), "qvalue must be a matrix [In, Out], got shape (4,)"),
    (dict(scale=(3, 6)), "scale must be [G, 6] with G dividing In = 8, got shape (3, 6)"),
    (dict(scale=(2, 5)), "scale must be [G, 6] with G dividing In = 8, got shape (2, 5)"),
    (dict(offset=(1, 6)), "offset must be None or of the scale's shape (2, 6), got shape (1, 6)"),
    (dict(input_scale=(6,)), "input_scale must be None or [8], got shape (6,)"),
])
def test_quantized_weights_reject_bad_shapes_by_name(changes, message):
    shapes = {"qvalue": (8, 6), "scale": (2, 6), **changes}  # In = 8, Out = 6, G = 2
    arrays = {name: jnp.zeros(shape, jnp.int8 if name == "qvalue" else jnp.float32)
              for name, shape in shapes.items()}
    with pytest.raises(ValueError, match=re.escape(message)):
        qlinear.QuantizedWeights(**arrays)


def test_a_quantized_einsum_refuses_weights_of_another_kernel_shape():
    weights = qlinear.QuantizedWeights(jnp.zeros((8, 6), jnp.int8), jnp.ones((1, 6)))
    with pytest.raises(ValueError, match=re.escape("qvalue must be [8, 4] (kernel_shape (8, 4) "
                                                   "as [In, Out]), got (8, 6)")):
        QuantizedEinsum("BTD,DF->BTF", (8, 4), weights)
    with pytest.raises(ValueError, match="weights must be a QuantizedWeights, got tuple"):
        QuantizedEinsum("BTD,DF->BTF", (8, 6), (weights.qvalue, weights.scale))


def test_int4_on_an_odd_input_width_is_refused_by_name():
    odd = dl.Transformer(dl.ModelConfig(position="rope", **{**TINY, "d_ff": 65}), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=re.escape(
            "weights='int4' packs two values per byte along the input dimension, which must be "
            "even; blocks.0.mlp.down has 65 inputs")):
        dl.quantize(odd, weights="int4")
    assert describe(dl.quantize(odd, weights="int8"))["blocks.0.mlp.down"]["qvalue"] == "int8"


@pytest.mark.parametrize("groups", [0, 5, 2.0])
def test_activation_terms_refuse_groups_that_do_not_divide_the_inputs(groups):
    with pytest.raises(ValueError, match=re.escape(
            f"groups must be a positive int dividing x's 64 inputs, got {groups!r}")):
        qlinear.activation_terms(jnp.ones((2, 64)), 1, groups)
