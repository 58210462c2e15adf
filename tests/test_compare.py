"""dl.compare: the KL-divergence scoreboard of a candidate model against a reference, checked on
stand-in models with fixed distributions over a 3-token vocabulary, then on real models."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from standins import TINY

import decodelab as dl

# Next-token distributions per position (the same for every window).
REFERENCE = [[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]
CANDIDATE = [[0.5, 0.3, 0.2], [0.3, 0.6, 0.1], [0.1, 0.3, 0.6]]
WINDOWS = np.asarray([[0, 1, 2, 0], [2, 0, 0, 1]], np.int32)  # 2 windows x 3 scored positions


def stand_in(distributions):
    """``tokens [B, T] -> logits [B, T, 3]``: position j's logits are log(distributions[j])."""
    table = jnp.log(jnp.asarray(distributions + [[1 / 3] * 3], jnp.float32))  # [T, 3]
    return lambda tokens: jnp.broadcast_to(table[None], (tokens.shape[0], *table.shape))


def test_scoreboard_of_fixed_distributions_equals_the_hand_computed_values():
    board = dl.compare(stand_in(REFERENCE), stand_in(CANDIDATE), WINDOWS)
    kl = [0.0,
          0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6),
          0.2 * math.log(0.2 / 0.1) + 0.2 * math.log(0.2 / 0.3)]  # the 0.6 / 0.6 term is 0
    assert board.positions == 6
    assert board.kl_mean == pytest.approx(sum(kl) / 3, abs=1e-6)
    # 99th percentile: rank 0.99 * 5 = 4.95 of the 6 sorted values [0, 0, kl2, kl2, kl1, kl1],
    # between two values both kl1
    assert board.kl_p99 == pytest.approx(kl[1], abs=1e-6)
    assert board.same_top == pytest.approx(100 * 2 / 3)  # position 1's top token differs
    # at the reference's top token: 0.5 -> 0.5, 0.6 -> 0.3, 0.6 -> 0.6
    assert board.rms_top_prob == pytest.approx(math.sqrt(0.3**2 / 3), abs=1e-6)
    # targets: window 0 -> tokens 1, 2, 0; window 1 -> 0, 0, 1
    ref_nll = -(math.log(0.3) + math.log(0.1) + math.log(0.2)
                + math.log(0.5) + math.log(0.6) + math.log(0.2)) / 6
    cand_nll = -(math.log(0.3) + math.log(0.1) + math.log(0.1)
                 + math.log(0.5) + math.log(0.3) + math.log(0.3)) / 6
    assert board.perplexity_reference == pytest.approx(math.exp(ref_nll), rel=1e-5)
    assert board.perplexity_candidate == pytest.approx(math.exp(cand_nll), rel=1e-5)
    assert board.perplexity_diff == pytest.approx(math.exp(cand_nll) - math.exp(ref_nll),
                                                  rel=1e-4)
    assert board.parameter_bytes_reference is None and board.kv_bytes_per_token_candidate is None
    # per window (the same distributions in both windows; different targets)
    assert board.kl_per_window == pytest.approx((sum(kl) / 3,) * 2, abs=1e-6)
    assert board.same_top_per_window == pytest.approx((100 * 2 / 3,) * 2)
    assert board.nll_reference_per_window == pytest.approx(
        (-(math.log(0.3) + math.log(0.1) + math.log(0.2)) / 3,
         -(math.log(0.5) + math.log(0.6) + math.log(0.2)) / 3), abs=1e-6)
    assert board.nll_candidate_per_window == pytest.approx(
        (-(math.log(0.3) + math.log(0.1) + math.log(0.1)) / 3,
         -(math.log(0.5) + math.log(0.3) + math.log(0.3)) / 3), abs=1e-6)


@pytest.fixture(scope="module")
def model():
    return dl.Transformer(dl.ModelConfig(position="rope", **TINY), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def windows():
    return np.asarray(jax.random.randint(jax.random.key(3), (3, 17), 0, TINY["vocab_size"]))


def test_a_model_against_itself_scores_zero_divergence(model, windows):
    board = dl.compare(model, model, windows, batch_size=2)
    assert board.positions == 3 * 16
    assert abs(board.kl_mean) < 1e-6 and board.same_top == 100.0 and board.rms_top_prob < 1e-6
    assert board.perplexity_diff == pytest.approx(0.0, abs=1e-4)
    assert board.parameter_bytes_candidate == board.parameter_bytes_reference == 623872


def test_quantized_weights_and_cache_show_in_divergence_and_bytes(model, windows):
    int8 = dl.quantize(model, weights="int8")
    weights = dl.compare(model, int8, windows)
    cache = dl.compare(model, model, windows, candidate_kv_cache="int8")
    for board in (weights, cache):
        assert 0 < board.kl_mean <= board.kl_p99
    assert weights.parameter_bytes_candidate == dl.parameter_bytes(int8) < 623872
    assert (cache.kv_bytes_per_token_reference, cache.kv_bytes_per_token_candidate) == (512, 160)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tokens=np.zeros((4,), np.int32)), r"tokens must be integer windows \[W, T\]"),
    (dict(tokens=WINDOWS, candidate_kv_cache="int2"),
     r"candidate_kv_cache must be None \(float\) or one of \('int8', 'int4'\), got 'int2'"),
    (dict(tokens=WINDOWS, batch_size=0), "batch_size must be an int >= 1, got 0"),
])
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.compare(stand_in(REFERENCE), stand_in(CANDIDATE), **kwargs)
