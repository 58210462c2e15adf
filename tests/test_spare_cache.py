"""The spare cache (``cache.spares``, ``decode.caches``): ``generate`` writes over the cache the
previous call of the same layout left, never zero-filling it again, and gives exactly the tokens
and log-probabilities of a call on a new cache, whatever the stale slots hold."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab.cache.spares import SPARES, Spares
from decodelab.decode import caches

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 2], [11], [3, 3, 3, 3]]
MAX_LEN = 96


@pytest.fixture(scope="module")
def model(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(3))


def run(model, prompts=PROMPTS, params=None, tokens=12):
    params = params or dl.SamplingParams(temperature=0.9, top_p=0.95, repetition_penalty=1.2)
    return dl.generate(model, prompts, params, tokens, seed=[4, 5, 6, 7][:len(prompts)],
                       options=dl.DecodeOptions(max_len=MAX_LEN))


def fresh(model, **kwargs):
    """The call on a new cache (nothing held)."""
    SPARES.release()
    return run(model, **kwargs)


def same(a, b) -> None:
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert a.finish_reason == b.finish_reason


@pytest.fixture
def new_caches(monkeypatch):
    """Counts the new caches ``generate`` allocates."""
    made = []
    allocate = caches.new_cache

    def counted(*args, **kwargs):
        made.append(kwargs["max_len"])
        return allocate(*args, **kwargs)

    monkeypatch.setattr(caches, "new_cache", counted)
    return made


def test_a_call_writes_over_the_previous_calls_cache_and_decodes_the_same(model, new_caches):
    expected = fresh(model)
    # Longer prompts and outputs first, so the stale slots hold another call's keys past where
    # this call's rows start; then the call again on the spare.
    other = run(model, prompts=[[p + 1 for p in row] * 3 for row in PROMPTS], tokens=40)
    again = run(model)
    same(again, expected)
    assert new_caches == [MAX_LEN]  # the first call's; the next two wrote over its cache
    assert SPARES.held_bytes > 0
    assert other.tokens.shape[1] >= 40


def test_stale_slots_of_any_finite_size_change_nothing(model):
    expected = fresh(model)
    graphdef, weights = nnx.split(model)
    stale = caches.new_cache(weights, graphdef=graphdef, batch_size=len(PROMPTS), max_len=MAX_LEN,
                             kind=None)
    huge = jnp.finfo(jnp.float32).max / 4
    stale = stale.replace(k=jnp.full_like(stale.k, huge), v=jnp.full_like(stale.v, -huge),
                          lengths=jnp.full_like(stale.lengths, MAX_LEN))
    SPARES.keep(caches.layout_key(model, stale.batch_size, MAX_LEN, None), stale)
    same(run(model), expected)


def test_a_call_of_another_layout_drops_the_spare_and_allocates(model, new_caches):
    run(model)
    held = SPARES.held_bytes
    out = dl.generate(model, PROMPTS, dl.SamplingParams.greedy(), 4,
                      options=dl.DecodeOptions(max_len=2 * MAX_LEN))
    assert new_caches[-1] == 2 * MAX_LEN and SPARES.held_bytes == 2 * held
    assert out.tokens.shape == (len(PROMPTS), 4)


def test_a_call_with_non_finite_logits_keeps_no_spare(model):
    SPARES.release()
    graphdef, weights = nnx.split(model)
    cache = caches.new_cache(weights, graphdef=graphdef, batch_size=4, max_len=MAX_LEN, kind=None)
    caches.keep_cache(model, cache, MAX_LEN, None, np.array([1, 4, 3, 3]))  # a BAD_LOGITS row
    assert SPARES.held_bytes == 0
    caches.keep_cache(model, cache, MAX_LEN, None, np.array([1, 3, 3, 3]))
    assert SPARES.held_bytes == cache.nbytes()


def test_spares_hold_one_cache_and_give_it_to_one_taker(tiny_config):
    spares = Spares()
    cache = dl.KVCache.init(tiny_config, 2, 16)
    spares.keep("a", cache)
    assert spares.take("b") is None and spares.held_bytes == 0  # another layout drops it
    spares.keep("a", cache)
    assert spares.take("a") is cache and spares.take("a") is None
    spares.keep("a", cache)
    spares.release()
    assert spares.held_bytes == 0


def test_int8_and_int4_caches_are_reused_exactly(model):
    greedy, options = dl.SamplingParams.greedy(), dl.DecodeOptions(max_len=MAX_LEN)
    for kind in ("int8", "int4"):
        SPARES.release()
        expected = dl.generate(model, PROMPTS, greedy, 10, kv_cache=kind, options=options)
        dl.generate(model, [row * 4 for row in PROMPTS], greedy, 30, kv_cache=kind,
                    options=options)
        assert SPARES.held_bytes > 0
        same(dl.generate(model, PROMPTS, greedy, 10, kv_cache=kind, options=options), expected)
