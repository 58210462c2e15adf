"""The Cache protocol: every cache (dense, int8, int4 / KIVI, the beam view, the paged view, a
rows view) implements it; a row's slots read the same through ``read`` and ``gather``; only KIVI
has a float tail; a wrapper's lengths and sizes are its inner cache's; room and rewinds are checked
alike; what a cache cannot do it refuses with the reason; lengths bucket in one place."""

import jax.numpy as jnp
import numpy as np
import pytest

import decodelab as dl
from decodelab import cache as kvcache
from decodelab.decode import request

CFG = dl.ModelConfig(vocab_size=8, d_model=4, n_layers=2, n_heads=1, position="nope")  # K 1, H 4
B, S = 2, 8


def empty(kind: str) -> kvcache.Cache:
    """An empty cache of ``B`` rows of ``S`` slots, of ``kind``."""
    if kind == "dense":
        return kvcache.KVCache.init(CFG, B, S)
    if kind == "int8":
        return kvcache.QuantizedKVCache.init(CFG, B, S)
    if kind == "int4":
        return kvcache.KiviKVCache.init(CFG, B, S, kvcache.Kivi(group_size=4, max_rewind=4))
    if kind == "beam":  # two beams of one prompt row
        return kvcache.BeamCache.from_prompts(kvcache.KVCache.init(CFG, 1, S), B)
    if kind == "paged":  # row 0 on pages 3, 0; row 1 on pages 1, 2 (of 4 pages of 4 slots)
        paged = kvcache.PagedKVCache.init(CFG, B, num_pages=4, page_size=4, max_pages=2)
        return paged.replace(table=jnp.asarray([[3, 0], [1, 2]], jnp.int32))
    assert kind == "rows"  # rows 0 and 2 of a 3-row cache
    return kvcache.RowView.of(kvcache.KVCache.init(CFG, 3, S), jnp.asarray([0, 2]),
                              jnp.zeros((B,), jnp.int32), reach=S)


KINDS = ["dense", "int8", "int4", "beam", "paged", "rows"]
SHARING = ["dense", "int8", "beam", "paged", "rows"]  # rows may read each other's slots


def written(kind: str, valid=(5, 3)) -> kvcache.Cache:
    """``empty(kind)`` after one block of 5 tokens in every layer, ``valid`` of them real."""
    cache = empty(kind)
    rng = np.random.default_rng(0)
    for layer in range(CFG.n_layers):
        k, v = (jnp.asarray(rng.normal(size=(B, 5, 1, 4)), jnp.float32) for _ in range(2))
        cache = cache.write(layer, k, v)
    return cache.advance(jnp.asarray(valid, jnp.int32))


@pytest.mark.parametrize("kind", KINDS)
def test_every_cache_implements_the_protocol(kind):
    cache = written(kind)
    assert isinstance(cache, kvcache.Cache)
    assert (cache.batch_size, cache.max_len) == (B, S)
    np.testing.assert_array_equal(cache.lengths, [5, 3])
    np.testing.assert_array_equal(cache.positions(2), [[5, 6], [3, 4]])
    k, v = cache.read(1, 0, S)
    assert k.shape == v.shape == (B, 1, S, 4)
    assert cache.nbytes() > 0


@pytest.mark.parametrize("kind", SHARING)
def test_gather_reads_what_read_does_from_the_row_it_names(kind):
    cache = written(kind)
    lengths = np.asarray(cache.lengths)
    read = [np.asarray(x) for x in cache.read(1, 0, S)]  # [B, K, S, H]
    slots = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
    for order in ([0, 1], [1, 0]):
        rows = jnp.broadcast_to(jnp.asarray(order, jnp.int32)[:, None], (B, S))
        gathered = cache.gather(1, rows, slots)
        for b, source in enumerate(order):
            for got, want in zip(gathered, read):
                live = lengths[source]
                np.testing.assert_array_equal(np.asarray(got)[b, :, :live], want[source, :, :live])


@pytest.mark.parametrize("kind", ["dense", "int8", "beam", "paged", "rows"])
def test_only_a_kivi_cache_has_a_float_tail(kind):
    cache = written(kind)
    assert cache.float_tail(0, cache.positions(1)) is None
    for stored, read in zip(cache.read_stored(0, 0, S), cache.read(0, 0, S)):
        np.testing.assert_array_equal(stored, read)


def test_a_kivi_cache_holds_its_written_block_in_its_float_tail():
    cache = written("int4")
    block = jnp.ones((B, 2, 1, 4), jnp.float32)
    cache = cache.write(0, block, block)
    tail = cache.float_tail(0, cache.positions(2))
    assert isinstance(tail, kvcache.FloatTail)
    np.testing.assert_array_equal(tail.positions[:, -2:], [[5, 6], [3, 4]])
    np.testing.assert_array_equal(tail.k[:, :, -2:], np.ones((B, 1, 2, 4)))


@pytest.mark.parametrize("kind", ["int8", "beam"])
def test_a_wrapper_takes_its_lengths_and_sizes_from_its_inner_cache(kind):
    cache = written(kind)
    assert isinstance(cache, kvcache.CacheWrapper)
    assert cache.lengths is cache.inner.lengths
    assert (cache.inner.batch_size, cache.inner.max_len) == (B, S)
    np.testing.assert_array_equal(cache.advance(jnp.asarray([1, 2])).inner.lengths, [6, 5])
    np.testing.assert_array_equal(cache.rewind(jnp.asarray([2, 0])).inner.lengths, [2, 0])


@pytest.mark.parametrize("kind", KINDS)
def test_room_and_rewinds_are_checked_alike_for_every_cache(kind):
    cache = written(kind)
    with pytest.raises(ValueError, match=r"^cache is full: row 0 has length 5 and the block adds "
                                         r"4 tokens, but max_len is 8"):
        cache.check_room(np.asarray([4, 0], np.int32))
    with pytest.raises(ValueError, match=r"^rewind lengths must be in \[0, current length\] per "
                                         r"row, got \[6, 0\] for current lengths \[5, 3\]"):
        cache.rewind(jnp.asarray([6, 0]))
    np.testing.assert_array_equal(cache.rewind(jnp.asarray([1, 3])).lengths, [1, 3])


@pytest.mark.parametrize(("kind", "call", "reason"), [
    ("int4", lambda c: c.gather(0, jnp.zeros((B, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32)),
     r"int4 \(KIVI\) cache cannot give one row another row's slots"),
    ("paged", lambda c: c.take_rows(jnp.asarray([1, 0])), r"PagedKVCache cannot take rows"),
    ("rows", lambda c: c.take_rows(jnp.asarray([1, 0])), r"RowView cannot take rows"),
])
def test_what_a_cache_cannot_do_it_refuses_with_the_reason(kind, call, reason):
    with pytest.raises(ValueError, match=reason):
        call(written(kind))


def test_bytes_count_every_array_a_read_needs_but_the_lengths():
    L, K, H = CFG.n_layers, CFG.n_kv_heads, CFG.head_dim
    assert written("dense").nbytes() == 2 * L * B * K * S * H * 4
    assert written("int8").nbytes() == 2 * L * B * K * S * (H + 4)  # int8 values, a scale each
    assert written("beam").nbytes() == 2 * L * B * K * S * H * 4 + B * S * 4  # + the slot table
    assert written("paged").nbytes() == 2 * L * 4 * K * 4 * H * 4 + B * 2 * 4  # + block table


def test_beam_search_refuses_a_cache_whose_rows_cannot_share_history():
    for kind in (None, "int8"):
        kvcache.check_kind("kv_cache", kind, shared_by="beam search")
    for kind in ("int4", kvcache.Kivi(group_size=8)):
        with pytest.raises(ValueError, match=r"^kv_cache must be None or 'int8' for beam search"):
            kvcache.check_kind("kv_cache", kind, shared_by="beam search")


def test_lengths_bucket_to_powers_of_two_in_one_place():
    assert [kvcache.bucket_length(n) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]
    assert [kvcache.bucket_length(n, minimum=1) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]
    assert request.bucket_length is kvcache.bucket_length
