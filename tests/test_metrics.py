"""Perplexity: exact on stand-in models whose log-likelihoods are known, the documented targets and
context are the ones scored, batching and padding change nothing, one compile per shape, and bad
arguments are refused by name."""

import math

import numpy as np
import pytest
import standins
from flax import nnx

import decodelab as dl
from decodelab.measure import count_traces
from decodelab.measure import perplexity as metrics
from decodelab.text import data
from decodelab.train import trainer as train

V = 16


uniform = standins.uniform(V)
next_is_last_plus_one = standins.next_is_last_plus_one(V)
one_in_position_plus_one = standins.one_in_position_plus_one(V)  # target 0: NLL log(j + 1) at j


@pytest.fixture(scope="module")
def model(tiny_config):
    return dl.Transformer(tiny_config.replace(position="alibi"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def stream(tiny_config):
    rng = np.random.default_rng(0)
    return rng.integers(0, tiny_config.vocab_size, size=1000).astype(np.int32)


def test_a_uniform_model_has_perplexity_v():
    result = metrics.perplexity(uniform, np.zeros(101, np.int32), 10, batch_size=4)
    assert result["loss"] == pytest.approx(math.log(V), rel=1e-6)
    assert result["perplexity"] == pytest.approx(V, rel=1e-6)
    assert result["tokens"] == 100


def test_a_model_that_knows_the_next_token_has_perplexity_one():
    stream = np.arange(300, dtype=np.int32) % V
    for mode, stride in (("chunks", None), ("sliding", 3)):
        result = metrics.perplexity(next_is_last_plus_one, stream, 8, mode=mode, stride=stride)
        assert result["loss"] == 0.0 and result["perplexity"] == 1.0


def test_chunks_score_every_position_of_every_window():
    # 50 tokens, L = 8: (50 - 1) // 8 = 6 windows, 48 targets; the 49th target is the dropped tail.
    result = metrics.perplexity(one_in_position_plus_one, np.zeros(50, np.int32), 8, batch_size=4)
    assert result["tokens"] == 48
    assert result["loss"] == pytest.approx(np.mean(np.log(np.arange(1, 9))), rel=1e-6)


def test_sliding_scores_only_the_last_stride_positions_of_each_window():
    # 50 tokens, L = 8, S = 3: windows start at 0, 3, ..., 39 (14 windows) and score positions 5-7.
    result = metrics.perplexity(one_in_position_plus_one, np.zeros(50, np.int32), 8,
                                mode="sliding", stride=3, batch_size=4)
    assert result["tokens"] == 14 * 3
    assert result["loss"] == pytest.approx(np.mean(np.log([6, 7, 8])), rel=1e-6)


def test_window_nll_gives_each_window_its_scored_sum_in_stream_order():
    # The sliding case above: each of the 14 windows scores positions 5-7, -log(1/6 1/7 1/8)
    # nats; with batch_size 4 the last batch holds 2 windows and 2 padding rows (not returned).
    result = metrics.perplexity(one_in_position_plus_one, np.zeros(50, np.int32), 8,
                                mode="sliding", stride=3, batch_size=4)
    assert result["window_nll"] == pytest.approx([math.log(6 * 7 * 8)] * 14, rel=1e-6)
    assert sum(result["window_nll"]) / result["tokens"] == pytest.approx(result["loss"], rel=1e-12)


def test_sliding_with_stride_equal_to_the_context_is_chunks(model, stream):
    chunks = metrics.perplexity(model, stream, 32, batch_size=8)
    sliding = metrics.perplexity(model, stream, 32, mode="sliding", stride=32, batch_size=8)
    assert sliding["tokens"] == chunks["tokens"]
    assert sliding["loss"] == pytest.approx(chunks["loss"], rel=1e-6)


def test_chunks_count_as_train_evaluate_does(model, stream):
    chunks = metrics.perplexity(model, stream, 32, batch_size=8)
    evaluated = train.evaluate(model, data.eval_windows(stream, 32), batch_size=8)
    assert chunks["tokens"] == evaluated["tokens"]
    assert chunks["loss"] == pytest.approx(evaluated["loss"], rel=1e-6)


@pytest.mark.parametrize("mode, stride", [("chunks", None), ("sliding", 5)])
def test_the_batch_size_changes_nothing(model, stream, mode, stride):
    results = [metrics.perplexity(model, stream[:300], 16, mode=mode, stride=stride,
                                  batch_size=b) for b in (1, 7, 64)]
    assert len({r["tokens"] for r in results}) == 1
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-6)


def test_bits_per_char_of_a_fully_scored_stream_is_total_bits_over_chars():
    # 101 tokens at L = 10: all 100 targets are scored; a uniform model pays log2(V) bits each.
    result = metrics.perplexity(uniform, np.zeros(101, np.int32), 10, num_chars=400)
    assert result["bits_per_char"] == pytest.approx(100 * math.log2(V) / 400, rel=1e-6)


def test_bits_per_char_charges_unscored_targets_the_mean_loss():
    stream = np.zeros(50, np.int32)  # 49 targets, 42 scored (see the sliding test above)
    result = metrics.perplexity(one_in_position_plus_one, stream, 8, mode="sliding", stride=3,
                                num_chars=120)
    assert result["bits_per_char"] == pytest.approx(result["loss"] * 49 / 120 / math.log(2),
                                                    rel=1e-12)


def test_one_compile_per_batch_and_context_length():
    def fresh(tokens):  # a new function: its own compilation cache entries
        return uniform(tokens)

    stream = np.zeros(200, np.int32)
    with count_traces() as traces:
        metrics.perplexity(fresh, stream, 8, batch_size=4)
        metrics.perplexity(fresh, stream[:150], 8, mode="sliding", stride=2, batch_size=4)
        metrics.perplexity(fresh, stream, 8, mode="sliding", stride=5, batch_size=4)
    assert sum(traces.values()) == 1  # the stride and the stream's length are traced values
    with count_traces() as traces:
        metrics.perplexity(fresh, stream, 16, batch_size=4)
    assert sum(traces.values()) == 1


def test_a_learned_table_refuses_a_longer_context(tiny_config, stream):
    learned = dl.Transformer(tiny_config.replace(position="learned"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="position='learned' has 64 positions"):
        metrics.perplexity(learned, stream, 128)


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="windows"), r"mode must be one of \('chunks', 'sliding'\), got 'windows'"),
    (dict(context_len=0), "context_len must be an int >= 1, got 0"),
    (dict(stride=4), "stride must be None for mode='chunks'"),
    (dict(mode="sliding"), r"stride must be an int in \[1, context_len=8\] for mode='sliding', "
                           "got None"),
    (dict(mode="sliding", stride=9), r"stride must be an int in \[1, context_len=8\]"),
    (dict(mode="sliding", stride=0), r"stride must be an int in \[1, context_len=8\]"),
    (dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
    (dict(num_chars=0), "num_chars must be an int >= 1, got 0"),
    (dict(stream=np.zeros((2, 50), np.int32)), r"stream must be a 1-D array of token ids, got "
                                               r"shape \(2, 50\)"),
    (dict(stream=np.zeros(50, np.float32)), "stream must be a 1-D array of token ids"),
    (dict(stream=np.zeros(8, np.int32)), "stream must hold at least context_len [+] 1 = 9 tokens"),
    (dict(stream=np.full(50, -1, np.int32)), r"stream must hold ids in \[0, V\), got \[-1, -1\]"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    args = dict(model=uniform, stream=np.zeros(50, np.int32), context_len=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        metrics.perplexity(args.pop("model"), args.pop("stream"), args.pop("context_len"), **args)


def test_ids_beyond_the_models_vocabulary_are_refused(model):
    with pytest.raises(ValueError, match=r"stream must hold ids in \[0, 512\), got \[0, 512\]"):
        metrics.perplexity(model, np.arange(513, dtype=np.int32), 8)
