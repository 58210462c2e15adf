"""GGUF Q8_0 / Q4_0 / Q4_1 tensors kept as stored: their blocks map exactly onto quantize's
representation, and a model loaded with dequantize=False gives the dequantized model's logits."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab.compress.qlinear import QuantizedEinsum, QuantizedEmbed
from decodelab.convert.gguf_blocks import block_parts

gguf = pytest.importorskip("gguf", reason="GGUF files need gguf (the real extra)")


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_block_parts_rebuild_what_gguf_dequantizes(kind):
    weights = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    kind_type = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(weights, kind_type)
    q, scale, offset = block_parts(kind, raw, weights.shape)
    assert q.shape == (6, 96) and scale.shape == (6, 3) and scale.dtype == np.float16
    assert (offset is None) == (kind != "Q4_1")
    low, high = (-128, 127) if kind == "Q8_0" else (-8, 7)
    assert low <= q.min() and q.max() <= high
    rebuilt = q.astype(np.float32) * np.repeat(scale.astype(np.float32), 32, axis=1)
    if offset is not None:
        rebuilt = rebuilt + np.repeat(offset, 32, axis=1)
    np.testing.assert_allclose(rebuilt, gguf.quants.dequantize(raw, kind_type), rtol=0,
                               atol=1e-6)


def logits(model, ids):
    return np.asarray(nnx.jit(lambda m, t: m(t))(model, jnp.asarray([ids], jnp.int32)))[0]


def test_a_block_quantized_tiny_gguf_keeps_its_blocks_and_its_logits(tmp_path):
    from tests.test_convert import prompt, tiny_llama, write_llama_gguf

    Q8, Q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    raw_types = {"token_embd.weight": Q8, "blk.0.attn_q.weight": Q8, "blk.1.attn_k.weight": Q4,
                 "blk.0.attn_output.weight": Q4, "blk.1.ffn_down.weight": Q4}
    path = tmp_path / "blocks.gguf"
    write_llama_gguf(path, tiny_llama("default"), raw_types=raw_types)
    dequantized, _ = dl.load_gguf(path)
    kept, _ = dl.load_gguf(path, dequantize=False)
    quantized = {path: m for path, m in nnx.iter_modules(kept) if isinstance(m, QuantizedEinsum)}
    assert {".".join(map(str, p)): str(m.qvalue.dtype) for p, m in quantized.items()} == {
        "embed": "int8", "blocks.0.attn.q": "int8", "blocks.1.attn.k": "int4",
        "blocks.0.attn.o": "int4", "blocks.1.mlp.down": "int4"}
    assert isinstance(kept.embed, QuantizedEmbed)
    assert dl.parameter_bytes(kept) < dl.parameter_bytes(dequantized)
    ids = prompt(24)
    np.testing.assert_allclose(logits(kept, ids), logits(dequantized, ids), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_smollm2_q4_1_file_runs_as_4_bit_weights_with_the_dequantized_logits(smollm2_installed):
    from decodelab.experiment import presets

    path = presets.pretrained_path(smollm2_installed)
    dequantized, _ = dl.load_gguf(path)
    kept, _ = dl.load_gguf(path, dequantize=False)
    projections = [m for _, m in nnx.iter_modules(kept)
                   if isinstance(m, QuantizedEinsum) and not isinstance(m, QuantizedEmbed)]
    assert len(projections) == 30 * 7
    assert all(m.qvalue.dtype == jnp.int4 and m.offset is not None for m in projections)
    assert kept.embed.qvalue.dtype == jnp.int8  # the file's token_embd is Q8_0
    ids = [1, 520, 3000, 44, 9, 17, 812, 90, 4, 77, 1500, 26]
    # Float32 rounding over 30 blocks grows with the logit (~25 here): a relative term as well.
    np.testing.assert_allclose(logits(kept, ids), logits(dequantized, ids), atol=1e-4, rtol=2e-5)
