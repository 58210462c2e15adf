"""dl.prune: magnitude and Wanda scores, unstructured and N:M patterns, exact to the requested
fraction of every projection, embeddings and head untouched; prune_heads / prune_neurons: a
smaller model whose logits equal the dense model with those heads or units masked."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import TINY

import decodelab as dl
from decodelab.compress.patterns import mask_of, scores
from decodelab.compress.pruning import (head_importance, heads_to_keep, mask_heads, mask_neurons,
                                        masks, neurons_to_keep, prune_heads, prune_neurons)
from decodelab.compress.quantization import as_matrix, calibrate, projections
from decodelab.text import data

# A 4 x 4 projection [In, Out] and the L2 norms of its 4 input channels. Input 1 carries small
# activations (0.25) but large weights; input 2 large activations (2).
W = np.array([[1.0, -2.0, 2.5, 0.5],
              [-8.0, 5.0, -1.0, 2.4],
              [2.0, 3.0, 1.5, -1.0],
              [1.5, -1.2, 4.0, 3.0]], np.float32)
NORMS = np.array([1.0, 0.25, 2.0, 1.0], np.float32)
# Kept weights at 50% per output (column), worked by hand. Wanda scores |W| * norm, e.g. column 1:
# [2, 1.25, 6, 1.2] keeps inputs 0 and 2; by magnitude [2, 5, 3, 1.2] keeps inputs 1 and 2.
WANDA_KEEPS = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 1, 1]], bool)
MAGNITUDE_KEEPS = np.array([[0, 0, 1, 0], [1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]], bool)


@pytest.fixture(scope="module")
def model():
    return dl.Transformer(dl.ModelConfig(position="rope", **TINY), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 16), 0, TINY["vocab_size"], jnp.int32)


def matrices(model):
    return {path: np.asarray(as_matrix(module)[0]) for path, module in projections(model, False)}


def test_wanda_and_magnitude_keep_the_weights_worked_by_hand():
    np.testing.assert_array_equal(mask_of(scores(W, NORMS), 0.5, "unstructured", "row"),
                                  WANDA_KEEPS)
    np.testing.assert_array_equal(mask_of(scores(W, None), 0.5, "unstructured", "row"),
                                  MAGNITUDE_KEEPS)


@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.7])
def test_unstructured_sparsity_is_exact_per_output_and_per_matrix(model, sparsity):
    for scope in ("row", "layer"):
        pruned = matrices(dl.prune(model, sparsity=sparsity, scope=scope))
        for path, w in pruned.items():
            In, Out = w.shape
            zeros = (w == 0)
            if scope == "row":
                assert zeros.sum(axis=0).tolist() == [round(sparsity * In)] * Out, path
            else:
                assert zeros.sum() == round(sparsity * In * Out), path


@pytest.mark.parametrize("pattern, n, m", [("2:4", 2, 4), ("4:8", 4, 8)])
def test_n_m_zeroes_exactly_n_of_every_m_consecutive_inputs(model, tokens, pattern, n, m):
    for method, calibration in (("magnitude", None), ("wanda", tokens)):
        pruned = dl.prune(model, method, sparsity=n / m, pattern=pattern, calibration=calibration)
        for path, w in matrices(pruned).items():
            In, Out = w.shape
            per_group = (w.reshape(In // m, m, Out) == 0).sum(axis=1)
            assert (per_group == n).all(), path


def test_the_kept_weights_are_unchanged_and_the_rest_of_the_model_untouched(model):
    pruned = dl.prune(model, sparsity=0.5)
    dense = matrices(model)
    for path, w in matrices(pruned).items():
        np.testing.assert_array_equal(w[w != 0], dense[path][w != 0])
        np.testing.assert_array_equal(np.asarray(masks(pruned)[path]).reshape(w.shape), w != 0)
    np.testing.assert_array_equal(pruned.embed.embedding[...], model.embed.embedding[...])
    assert dl.generate(pruned, [[5, 9, 13]], dl.SamplingParams.greedy(), 4).token_lists()


def test_wanda_weighs_each_input_by_its_l2_norm_over_the_calibration_tokens(model, tokens):
    targets = projections(model, False)
    # ||X_i||_2 from the same inputs' X^T X: the square root of its diagonal.
    hessians = calibrate(model, targets, "gptq", tokens)
    pruned = matrices(dl.prune(model, "wanda", 0.5, calibration=tokens))
    differs = False
    for path, module in targets:
        w = as_matrix(module)[0]
        norm = jnp.sqrt(jnp.diag(hessians[path]))
        expected = mask_of(scores(w, norm), 0.5, "unstructured", "row")
        np.testing.assert_array_equal(pruned[path] != 0, np.asarray(expected))
        differs |= bool((expected != mask_of(scores(w, None), 0.5, "unstructured", "row")).any())
    assert differs  # the activations change which weights go


@pytest.mark.parametrize("kwargs, message", [
    (dict(sparsity=1.0), "sparsity must be a finite number in [0, 1), got 1.0"),
    (dict(sparsity=-0.1), "sparsity must be a finite number in [0, 1), got -0.1"),
    (dict(sparsity=True), "sparsity must be a finite number in [0, 1), got True"),
    (dict(pattern="3:5"), "pattern must be one of ('unstructured', '2:4', '4:8'), got '3:5'"),
    (dict(pattern="2:4", sparsity=0.3), "sparsity must be 0.5 for pattern='2:4'"),
    (dict(pattern="2:4", scope="layer"), "scope must be 'row' for pattern='2:4'"),
    (dict(method="wanda"), "calibration must be a token array [B, T] for method='wanda'"),
    (dict(method="sparsegpt"), "method must be one of ('magnitude', 'wanda'), got 'sparsegpt'"),
    (dict(scope="head"), "scope must be one of ('row', 'layer'), got 'head'"),
])
def test_bad_arguments_name_the_argument_and_what_is_allowed(model, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dl.prune(model, **kwargs)


@pytest.mark.slow
def test_recovery_training_keeps_the_pruned_weights_at_zero(model):
    from decodelab.compress.pruning import update_mask
    from decodelab.train.options import RunOptions
    from decodelab.train.trainer import train

    pruned = dl.prune(model, sparsity=0.5, pattern="2:4")
    tc = dl.TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, learning_rate=1e-2,
                        log_every=1, checkpoint_every=3)
    stream = np.random.default_rng(0).integers(0, TINY["vocab_size"], 4096)
    recovered = train(pruned.config, tc, stream, init=pruned, update_mask=update_mask(pruned),
                      run=RunOptions(progress=False)).model
    before, after = matrices(pruned), matrices(recovered)
    for path, w in after.items():
        np.testing.assert_array_equal(w == 0, before[path] == 0)  # the same zeros, and no more
        assert not np.allclose(w, before[path]), path  # the kept weights trained
    free = train(pruned.config, tc, stream, init=pruned, run=RunOptions(progress=False)).model
    with pytest.raises(ValueError, match=re.escape("update_mask must be a tree like "
                                                   "nnx.state(model)")):
        train(pruned.config, tc, stream, init=pruned, update_mask={"kernel": 1.0},
              run=RunOptions(progress=False))
    assert any((matrices(free)[p] != 0).sum() > (w != 0).sum() for p, w in before.items())


def logits(model, tokens):
    return nnx.jit(lambda m, t: m(t))(model, tokens)


@pytest.mark.parametrize("importance", ["norm", "taylor"])
def test_removing_head_groups_equals_masking_them(model, tokens, importance):
    keep = heads_to_keep(model, 2, importance, tokens)  # 2 query heads: one group of 2 per layer
    assert keep.shape == (2, 4) and keep.sum(axis=1).tolist() == [2, 2]
    smaller = prune_heads(model, 2, importance=importance, calibration=tokens)
    c = smaller.config
    assert (c.n_heads, c.n_kv_heads, c.head_dim) == (2, 1, 16)
    assert dl.param_count(smaller) < dl.param_count(model)
    masked = mask_heads(model, keep)
    np.testing.assert_allclose(logits(smaller, tokens), logits(masked, tokens), atol=1e-5,
                               rtol=1e-5)
    # The cache path too: greedy decoding of the smaller model is the masked model's.
    greedy = dl.SamplingParams.greedy()
    assert (dl.generate(smaller, [[5, 9, 13]], greedy, 6).token_lists()
            == dl.generate(masked, [[5, 9, 13]], greedy, 6).token_lists())


@pytest.mark.parametrize("importance", ["norm", "taylor"])
def test_removing_hidden_units_equals_masking_them(model, tokens, importance):
    keep = neurons_to_keep(model, 0.25, importance, tokens)
    assert keep.sum(axis=1).tolist() == [192, 192]
    smaller = prune_neurons(model, 0.25, importance=importance, calibration=tokens)
    assert smaller.config.d_ff == 192
    np.testing.assert_allclose(logits(smaller, tokens), logits(mask_neurons(model, keep), tokens),
                               atol=1e-5, rtol=1e-5)


def mean_loss(model, tokens):
    from decodelab.model.losses import token_nll

    return float(jnp.mean(token_nll(logits(model, tokens[:, :-1]), tokens[:, 1:])))


def test_taylor_importance_is_the_loss_derivative_with_respect_to_a_head_mask(model, tokens):
    importance = head_importance(model, "taylor", tokens)  # [L, K]
    eps = 1e-2

    def loss_at(layer, group, scale):  # the group's output scaled by ``scale``
        keep = np.ones((2, 4), np.float32)
        keep[layer, 2 * group:2 * group + 2] = scale
        return mean_loss(mask_heads(model, keep), tokens)

    for layer in range(2):
        for group in range(2):  # central difference of dL/dscale at scale 1
            derivative = (loss_at(layer, group, 1 + eps) - loss_at(layer, group, 1 - eps)) / (
                2 * eps)
            assert importance[layer, group] == pytest.approx(abs(derivative), rel=0.02)


def test_pruned_checkpoints_round_trip_their_zeros_and_smaller_config(model, tokens, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(data.split_documents("train")["hamlet"][:20000], encoding="utf-8")
    tokenizer = dl.Tokenizer.train([corpus], vocab_size=TINY["vocab_size"], model_type="bpe")
    sparse = dl.prune(model, sparsity=0.5, pattern="2:4")
    dl.save_checkpoint(tmp_path / "sparse", sparse, tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "sparse")
    saved, restored = matrices(sparse), matrices(loaded)
    assert saved.keys() == restored.keys()
    for path, matrix in saved.items():
        np.testing.assert_array_equal(restored[path], matrix)
        assert (matrix == 0).mean() == 0.5
    np.testing.assert_array_equal(logits(loaded, tokens), logits(sparse, tokens))

    smaller = prune_neurons(prune_heads(model, 0.5), 0.5)
    dl.save_checkpoint(tmp_path / "smaller", smaller, tokenizer)
    loaded, _ = dl.load_checkpoint(tmp_path / "smaller")
    assert loaded.config == smaller.config
    assert (loaded.config.n_heads, loaded.config.d_ff) == (2, 128)
    np.testing.assert_array_equal(logits(loaded, tokens), logits(smaller, tokens))


@pytest.mark.parametrize("call, message", [
    (lambda m: prune_heads(m, 4), "heads_per_layer must leave at least one key/value head group "
                                  "of query heads in every layer (there are 2), got "
                                  "heads_per_layer=4"),
    (lambda m: prune_heads(m, 1), "heads_per_layer must be a multiple of 2"),
    (lambda m: prune_heads(m, 1.0), "heads_per_layer as a fraction must be in (0, 1), got 1.0"),
    (lambda m: prune_neurons(m, 256), "fraction must leave at least one hidden unit"),
    (lambda m: prune_neurons(m, "half"), "fraction must be an int count or a fraction in (0, 1)"),
    (lambda m: prune_neurons(m, 0.5, importance="taylor"),
     "calibration must be a token array [B, T] for importance='taylor'"),
    (lambda m: mask_heads(m, np.ones((2, 3))), "keep must have shape [layers, units] = [2, 4], "
                                               "got [2, 3]"),
    (lambda m: mask_neurons(m, np.ones(256)), "keep must have shape [layers, units] = [2, 256]"),
    (lambda m: scores(W, NORMS[:3]), "input_norm must have one value per input (4), got shape "
                                     "[3]"),
    (lambda m: prune_heads(m, 2, importance="fisher"),
     "importance must be one of ('norm', 'taylor'), got 'fisher'"),
    (lambda m: dl.prune(dl.quantize(m, weights="int8")), "model must be a float model for "
     "prune, got a quantized one (int8 in 14 projections); use the float model (and quantize "
     "afterwards) or decodelab.compress.dequantized(model)"),
    (lambda m: prune_heads(dl.quantize(m, weights="int4"), 2), "model must be a float model for "
                                                               "prune_heads, got a quantized one"),
    (lambda m: mask_neurons(dl.quantize(m, weights="int8"), np.ones((2, 256))),
     "model must be a float model for mask_neurons"),
    (lambda m: prune_heads(dl.Transformer(dl.ModelConfig(position="alibi", **TINY),
                                          rngs=nnx.Rngs(0)), 2),
     "model's position encoding must be one of ('rope', 'learned', 'sinusoidal', 'nope')"),
])
def test_bad_structured_arguments_name_the_argument(model, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call(model)


# Pruning a pruned model (decodelab.compress's table): the old zeros stay and the request is met
# exactly; a request for fewer zeros than a projection holds is refused, one that some groups
# exceed warns. (first, then, the sparsity after, the warning or error.)
@pytest.mark.parametrize("first, then, after, refusal", [
    (dict(sparsity=0.5), dict(sparsity=0.75), 0.75, None),
    (dict(sparsity=0.5, pattern="2:4"), dict(sparsity=0.5, pattern="4:8"), 0.5, None),
    (dict(sparsity=0.25, scope="layer"), dict(sparsity=0.5, scope="layer"), 0.5, None),
    (dict(sparsity=0.5), dict(sparsity=0.25), None,
     (ValueError, "sparsity=0.25 with pattern='unstructured' leaves 512 zeros in blocks.0.attn.k, "
                  "which already holds 1024 (sparsity 0.5): pruned weights cannot come back")),
    (dict(sparsity=0.5), dict(sparsity=0.5, pattern="2:4"), None,
     (UserWarning, "prune: model's existing zeros exceed what sparsity=0.5 with pattern='2:4' "
                   "asks in some groups, and stay: blocks.0.attn.k: 0.")),
])
def test_pruning_a_pruned_model_keeps_its_zeros_and_meets_the_request(model, first, then, after,
                                                                       refusal):
    once = dl.prune(model, **first)
    if refusal is not None and refusal[0] is ValueError:
        with pytest.raises(ValueError, match=re.escape(refusal[1])):
            dl.prune(once, **then)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        twice = dl.prune(once, **then)
    assert [str(w.message)[:len(refusal[1])] for w in caught] == ([] if refusal is None
                                                                  else [refusal[1]])
    before = matrices(once)
    for path, w in matrices(twice).items():
        assert np.all(w[before[path] == 0] == 0)
        assert after is None or np.mean(w == 0) == after


def test_quantizing_a_pruned_model_keeps_each_pruned_weight_exactly_zero(model):
    pruned = dl.prune(model, sparsity=0.5)
    q = dl.quantize(pruned, weights="int4", group_size=32)
    assert masks(q).keys() == masks(pruned).keys()
    for path, kept in masks(q).items():
        np.testing.assert_array_equal(np.asarray(kept) | np.asarray(masks(pruned)[path]),
                                      np.asarray(masks(pruned)[path]))
