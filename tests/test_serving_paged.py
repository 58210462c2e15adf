"""Paged KV memory: the paged cache reads back what the padded cache holds; a request decoded
through pages gives the tokens and log-probs of the padded engine and of ``generate`` alone
(greedy and sampled, ragged, chunked), also when it is preempted and recomputed; the allocator and
the engine's block tables keep exact accounting under random events; shared pages return only
when no one reads them, and the prefix cache gives the tokens of no cache, also when preemption
and eviction race; bad input is refused."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab.cache.dense import KVCache
from decodelab.serving import EngineOptions, Request, SlotEngine
from decodelab.serving.paged import PagedKVCache, pages_for
from decodelab.serving.pages import PagePool
from decodelab.serving.pool import PagedMemory
from decodelab.serving.schedulers import Continuous, VirtualClock, replay

S = 64  # the tiny model's position table
GREEDY = dl.SamplingParams.greedy()
SAMPLED = dl.SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


def make_requests(n: int = 8, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(id=i, prompt=rng.integers(0, 512, int(rng.integers(1, 20))).tolist(),
                    max_new_tokens=int(rng.integers(5, 30)), params=(GREEDY, SAMPLED)[i % 2],
                    seed=1000 + 7 * i)
            for i in range(n)]


@pytest.fixture(scope="module")
def reference(tiny):
    """Each request's output from ``dl.generate`` on that request alone."""
    return {r.id: dl.generate(tiny, [list(r.prompt)], r.params, r.max_new_tokens, seed=[r.seed],
                              options=dl.DecodeOptions(max_len=S))
            for r in make_requests()}


def assert_alone(done, reference):
    """Tokens and finish reasons equal; log-probs within 1e-6 relative (one row alone and rows
    in a batch of 4 go through differently blocked matmuls: a few float32 ulps)."""
    assert sorted(done) == sorted(reference)
    for request_id, ref in reference.items():
        assert done[request_id].tokens == ref.token_lists()[0], request_id
        assert done[request_id].finish_reason == ref.finish_reason[0]
        np.testing.assert_allclose(done[request_id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=1e-6, atol=1e-6)


def test_paged_cache_reads_what_a_padded_cache_holds(tiny_config):
    """Ragged rows written in blocks through scattered pages read back, block by block, as the
    padded cache's slots; nothing is written to a page the row does not hold."""
    cfg = tiny_config
    B, page, M, P = 3, 8, 8, 30
    rng = np.random.default_rng(0)
    owned = rng.permutation(P)[:B * M].reshape(B, M)  # each row's pages, scattered
    paged = PagedKVCache.init(cfg, B, P, page, M).replace(table=jnp.asarray(owned, jnp.int32))
    padded = KVCache.init(cfg, B, M * page)
    L, K, H = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
    for T, valid in ((5, [5, 2, 0]), (11, [11, 11, 7]), (1, [1, 0, 1])):
        valid = jnp.asarray(valid, jnp.int32)
        for layer in range(L):
            k, v = (jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32) for _ in range(2))
            paged, padded = paged.write(layer, k, v), padded.write(layer, k, v)
        paged, padded = paged.advance(valid), padded.advance(valid)
    lengths = np.asarray(padded.lengths)
    for layer in range(L):
        for start, size in ((0, 64), (16, 32), (40, 32)):  # the last is clamped back
            got, want = paged.read(layer, start, size), padded.read(layer, start, size)
            first = min(start, M * page - size)
            for b in range(B):
                live = max(0, min(size, lengths[b] - first))
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g[b, :, :live], w[b, :, :live])
    # Pages no row holds are untouched.
    unused = sorted(set(range(P)) - set(owned.ravel()))
    assert not np.asarray(paged.k[:, unused]).any() and not np.asarray(paged.v[:, unused]).any()


@pytest.mark.parametrize("chunk", [None, 8])
def test_paged_engine_equals_padded_and_generate_alone(tiny, reference, chunk):
    requests = make_requests()
    options = EngineOptions(prefill_chunk=chunk)
    paged = SlotEngine(tiny, 4, S, kv_tokens=16 * S, page_size=8, options=options)
    through_pages = paged.run(requests, n=3)
    assert_alone(through_pages, reference)
    padded = SlotEngine(tiny, 4, S, options=options).run(requests, n=3)
    for request_id, completion in padded.items():  # the same batches: the same numbers
        assert through_pages[request_id].tokens == completion.tokens
        np.testing.assert_allclose(through_pages[request_id].logprobs, completion.logprobs,
                                   rtol=0, atol=1e-6)
    assert paged.pool.free == paged.pool.num_pages  # every page came back
    paged.pool.check()


def test_preempted_requests_end_with_the_tokens_of_an_uninterrupted_run(tiny, reference):
    """A pool of 80 tokens for 4 slots: requests grow into each other's memory, the newest is
    preempted, recomputed from prompt + its tokens, and ends exactly as alone."""
    engine = SlotEngine(tiny, 4, S, kv_tokens=80, page_size=8)
    queue, done, preemptions = make_requests(), {}, 0
    while queue or engine.active:
        for _ in range(engine.room(queue)):
            engine.insert(queue.pop(0))
        result = engine.step(2)
        preemptions += len(result.preempted)
        queue[:0] = result.preempted
        done |= {c.request_id: c for c in result.finished}
        engine.pool.check()
    assert preemptions >= 3
    assert_alone(done, reference)
    # The same through a replay: preemptions recorded, every request completed and exact.
    out = replay(SlotEngine(tiny, 4, S, kv_tokens=80, page_size=8), make_requests(),
                 Continuous(), clock=VirtualClock(), steps_per_call=2)
    assert out.summary["preemptions"] >= 3 and out.summary["completed"] == 8
    for record in out.records:
        assert record.tokens == reference[record.request_id].token_lists()[0]


def test_memory_bounded_admission(tiny):
    """Admission stops at the first request whose prompt does not fit in the free pages."""
    engine = SlotEngine(tiny, 8, S, kv_tokens=32, page_size=8)
    short = [Request(id=i, prompt=[1] * 10, max_new_tokens=4) for i in range(4)]
    assert engine.room(short) == 2  # 2 pages each (10 prompt tokens + 1 round), 4 pages
    engine.insert(short[0])
    engine.insert(short[1])
    assert engine.room(short[2:]) == 0


def test_allocator_fuzz_keeps_exact_accounting():
    """Thousands of random allocate / grow / release events: every page is free or held by one
    owner, holdings are what was granted, a failed allocation grants nothing."""
    rng = np.random.default_rng(0)
    pool = PagePool(64, 16)
    held: dict[int, list[int]] = {}
    for _ in range(5000):
        owner = int(rng.integers(0, 12))
        event = rng.choice(["allocate", "grow", "release"], p=[0.4, 0.4, 0.2])
        free = pool.free
        if event == "release":
            assert pool.release(owner) == len(held.pop(owner, []))
        else:
            n = int(rng.integers(0, 6)) if event == "allocate" else pool.lacks(
                owner, int(rng.integers(0, 200)))
            if n > free:
                with pytest.raises(ValueError, match="cannot allocate"):
                    pool.allocate(owner, n)
                assert pool.free == free
            else:
                new = pool.allocate(owner, n)
                assert len(new) == n and not set(new) & {p for v in held.values() for p in v}
                held.setdefault(owner, []).extend(new)
        pool.check()
        assert pool.free + sum(map(len, held.values())) == pool.num_pages
        for o, pages in held.items():
            assert pool.pages(o) == pages


def test_the_paging_policy_preempts_the_newest_and_admits_first_come_first_served():
    """On the host alone: admission counts the waiting requests that fit once the running ones'
    demand is met, stopping at the first that does not; when the demand does not fit, the most
    recently admitted slots give their pages back (reported oldest first) and the others grow,
    lowest pages first, into their table rows."""
    memory = PagedMemory(kv_tokens=64, page_size=8, num_slots=4, max_len=32)  # 8 pages of 8
    for slot in (2, 0, 1, 3):  # admission order
        memory.admit(slot)
    demand = {2: 16, 0: 16, 1: 8, 3: 0}  # 2 + 2 + 1 pages: 3 of 8 left
    assert memory.room(demand, [16, 8, 8]) == 2 and memory.room(demand, [32]) == 0
    assert memory.refuses(64) is None and "more than the whole pool" in memory.refuses(65)
    assert memory.provide({slot: 24 for slot in (2, 0, 1, 3)}) == [1, 3]  # 12 pages wanted
    assert memory.pool.pages(2) == [0, 1, 2] and memory.pool.pages(0) == [3, 4, 5]
    table = memory.changed_table()
    assert table[2].tolist() == [0, 1, 2, 8] and table[0].tolist() == [3, 4, 5, 8]
    assert (table[[1, 3]] == 8).all() and memory.changed_table() is None  # handed out once
    assert memory.decode_rows().tolist() == [0, 2]  # 2 occupied of 4 slots: 2 rows decode
    memory.release(2)
    assert memory.pool.free == 5 and (memory.changed_table()[2] == 8).all()
    memory.admit(1)
    memory.admit(3)
    assert memory.decode_rows() is None  # 3 occupied round up to all 4 slots
    memory.pool.check()


def test_engine_fuzz_tables_hold_only_each_requests_own_pages(tiny):
    """Random arrivals, budgets and steps per call on a tight pool: after every call the pool's
    accounting is exact, each occupied slot's device table row lists exactly its own pages (so
    attention reads nothing of another request), free slots hold none, and no page is in two
    rows."""
    rng = np.random.default_rng(3)
    engine = SlotEngine(tiny, 6, S, kv_tokens=96, page_size=8)
    queue = [Request(id=i, prompt=rng.integers(0, 512, int(rng.integers(1, 30))).tolist(),
                     max_new_tokens=int(rng.integers(1, 30)), seed=i,
                     params=(GREEDY, SAMPLED)[i % 2]) for i in range(40)]
    finished, preempted = set(), 0
    while queue or engine.active:
        admit = engine.room(queue)
        for _ in range(int(rng.integers(0, admit + 1)) if engine.active else admit):
            engine.insert(queue.pop(0))
        result = engine.step(int(rng.integers(1, 5)))
        preempted += len(result.preempted)
        queue[:0] = result.preempted
        finished |= {c.request_id for c in result.finished}
        pool = engine.pool
        pool.check()
        table = np.asarray(engine.state.cache.table)
        for slot in range(engine.num_slots):
            if engine.active.get(slot) is None:
                assert (table[slot] == pool.num_pages).all() and not pool.pages(slot)
            else:
                # Uploaded before the call that used it; the call's growth is all there.
                held = pool.pages(slot)
                assert table[slot, :len(held)].tolist() == held
                assert (table[slot, len(held):] == pool.num_pages).all()
        real = table[table < pool.num_pages]
        assert len(real) == len(set(real.tolist()))
    assert finished == set(range(40)) and preempted > 0
    assert engine.pool.free == engine.pool.num_pages


def test_bad_paged_arguments(tiny):
    with pytest.raises(ValueError, match="page_size must divide kv_tokens"):
        SlotEngine(tiny, 2, S, kv_tokens=100, page_size=8)
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        SlotEngine(tiny, 2, S, kv_tokens=96, page_size=12)
    with pytest.raises(ValueError, match="kv_tokens must be None"):
        SlotEngine(tiny, 2, S, kv_tokens=0)
    with pytest.raises(ValueError, match="kv_cache must be None"):
        SlotEngine(tiny, 2, S, kv_tokens=64, kv_cache="int8")
    with pytest.raises(ValueError, match="max_len must be a multiple of page_size"):
        SlotEngine(tiny, 2, 60, kv_tokens=64, page_size=16)
    with pytest.raises(ValueError, match="prefix_cache=True needs paged memory"):
        SlotEngine(tiny, 2, S, prefix_cache=True)
    with pytest.raises(ValueError, match="prefix_cache must be"):
        SlotEngine(tiny, 2, S, kv_tokens=64, prefix_cache="yes")
    engine = SlotEngine(tiny, 2, S, kv_tokens=32, page_size=8)
    too_long = Request(id="x", prompt=[1] * 20, max_new_tokens=20)
    assert "more than the whole pool (kv_tokens=32)" in engine.check(too_long)
    with pytest.raises(ValueError, match="cannot be served.*whole pool"):
        engine.insert(too_long)
    with pytest.raises(ValueError, match="cannot be served.*whole pool"):
        engine.run([too_long])
    assert pages_for(17, 8) == 3 and pages_for(16, 8) == 2
    for dtype in ("int8", jnp.int32, "not-a-dtype"):
        with pytest.raises(ValueError, match="dtype must be a float dtype"):
            PagedKVCache.init(tiny.config, 2, 4, 8, 2, dtype=dtype)
    assert PagedKVCache.init(tiny.config, 2, 4, 8, 2, dtype="bfloat16").k.dtype == jnp.bfloat16


def test_shared_pages_return_only_when_no_one_reads_them_and_idle_ones_are_evicted_lru():
    """A page read by two owners survives one release; a kept page goes to the idle queue (tail
    page first) and stays findable by its key until the free list runs out, then the least
    recently released idle page is evicted (its key forgotten) before any other."""
    pool = PagePool(6, 4)
    a = pool.allocate("a", 3)  # [0, 1, 2]
    first = pool.keep(a[0], (0, (1, 2, 3, 4)))
    second = pool.keep(a[1], (first, (5, 6, 7, 8)))
    assert pool.keep(a[2], (0, (1, 2, 3, 4))) == first  # a key already held: not kept again
    pool.share("b", a[:2])
    assert [pool.refs(p) for p in a] == [2, 2, 1]
    assert pool.release("a") == 3 and pool.free == 4 and pool.idle == 0  # 0, 1 still read
    pool.release("b")
    assert pool.idle == 2 and pool.free == 6 and pool.used == 0
    assert pool.find((first, (5, 6, 7, 8))) == (a[1], second)
    pool.share("c", [a[0]])  # a hit takes an idle page back
    assert pool.idle == 1 and pool.refs(a[0]) == 1
    assert pool.allocate("d", 4) == [3, 4, 5, 2] and pool.evictions == 0  # free list first
    assert pool.allocate("d", 1) == [a[1]] and pool.evictions == 1  # then the idle queue
    assert pool.find((first, (5, 6, 7, 8))) is None and pool.find((0, (1, 2, 3, 4)))
    with pytest.raises(ValueError, match="cannot allocate 1 pages"):
        pool.allocate("e", 1)
    pool.check()


def test_a_partly_read_page_is_copied_before_its_sharer_writes():
    """A page shared to be copied counts as lacking until ``copy`` gives the sharer its own page
    in the same logical place (allocated while the shared one is still read, so never that
    page) and drops its read of the shared one; a sharer released first copies nothing."""
    pool = PagePool(6, 4)
    a = pool.allocate("a", 3)  # [0, 1, 2]
    pool.keep(a[2], (0, (1, 2, 3, 4)))
    pool.share("b", a[:2], copy_last=True)
    assert pool.to_copy("b") == a[1] and pool.lacks("b", 8) == 1 and pool.lacks("b", 9) == 2
    pool.release("a")  # page 1 is still read by b, 0 too; 2 (kept) goes idle
    assert pool.refs(a[1]) == 1 and pool.idle == 1 and pool.free == 4
    assert pool.copy("b") == (a[1], 3) and pool.pages("b") == [a[0], 3]
    assert pool.refs(a[1]) == 0 and pool.to_copy("b") is None and pool.copy("b") is None
    assert pool.copies == 1 and pool.lacks("b", 8) == 0
    pool.share("c", [a[0]], copy_last=True)
    pool.release("c")
    assert pool.to_copy("c") is None and pool.refs(a[0]) == 1
    with pytest.raises(ValueError, match="already has a page to copy"):
        pool.share("d", [a[0]], copy_last=True) or pool.share("d", [a[1]], copy_last=True)
    pool.check()


def test_pool_fuzz_never_frees_or_evicts_a_page_someone_reads():
    """Random allocate / share (some to be copied) / copy / keep / release events: after each,
    every count equals the owners listing the page, no page with a positive count is free or
    idle (``check``), and a copy drops one read of the shared page for one of a page no one
    else reads; ``peak`` is the most pages read after any event."""
    rng = np.random.default_rng(7)
    pool, kept, most = PagePool(16, 4), {}, 0
    for event in range(3000):
        owner = int(rng.integers(0, 6))
        kind = rng.choice(["allocate", "share", "copy", "keep", "release"],
                          p=[0.3, 0.25, 0.1, 0.15, 0.2])
        held = pool.pages(owner)
        if kind == "allocate" and pool.free:
            pool.allocate(owner, int(rng.integers(1, pool.free + 1)))
        elif kind == "share":
            others = [p for o in pool.owners for p in pool.pages(o) if p not in held]
            pages = sorted(set(others))[:int(rng.integers(0, 3))]
            pool.share(owner, pages, copy_last=pool.to_copy(owner) is None and rng.random() < .5)
        elif kind == "copy" and pool.to_copy(owner) is not None and pool.free:
            shared = pool.to_copy(owner)
            readers = pool.refs(shared)
            index = pool.pages(owner).index(shared)
            assert pool.copy(owner) == (shared, pool.pages(owner)[index])
            assert pool.refs(shared) == readers - 1 and pool.refs(pool.pages(owner)[index]) == 1
        elif kind == "keep":
            kept = {k: p for k, p in kept.items() if pool.find(k) is not None}  # not evicted
            fresh = [p for p in held if p not in kept.values()]
            if fresh:
                page = fresh[int(rng.integers(0, len(fresh)))]
                kept[(0, event)] = page
                assert pool.keep(page, (0, event)) == pool.find((0, event))[1]
        elif kind == "release":
            readers = {p: pool.refs(p) for p in held}
            pool.release(owner)
            assert all(pool.refs(p) == readers[p] - 1 for p in held)
        pool.check()
        most = max(most, pool.used)
    assert pool.evictions > 0 and pool.copies > 0
    assert pool.peak == most  # the high-water mark sees every event's pages


def shared_prefix_requests(n: int, seed: int) -> list[Request]:
    """Requests whose prompts start with one 21-token prefix (2 full pages of 8 and 5 tokens
    into the third); a quarter are exactly its first 16 tokens (2 full pages: the second is
    recomputed for the last token's logits) and one in eight has a prompt of its own."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 512, 21).tolist()
    prompts = [prefix[:16] if i % 4 == 1 else
               rng.integers(0, 512, 12).tolist() if i % 8 == 3 else
               prefix + rng.integers(0, 512, int(rng.integers(0, 9))).tolist()
               for i in range(n)]
    return [Request(id=i, prompt=p, max_new_tokens=int(rng.integers(3, 20)),
                    params=(GREEDY, SAMPLED)[i % 2], seed=100 + i) for i, p in enumerate(prompts)]


def test_prefix_cache_gives_the_tokens_of_no_cache(tiny):
    """Requests that share a prefix ending mid-page, greedy and sampled: the later ones take
    its pages from the cache (the partly read last one copied on write), one admitted in the
    same call waits for the first's prefill, and each prefills only the rest; tokens equal
    those without the cache, log-probs within float32 rounding."""
    requests = shared_prefix_requests(8, seed=2)
    plain = SlotEngine(tiny, 2, S, kv_tokens=16 * S, page_size=8).run(requests, n=3)
    engine = SlotEngine(tiny, 2, S, kv_tokens=16 * S, page_size=8, prefix_cache=True)
    cached = engine.run(requests, n=3)
    for request in requests:
        assert cached[request.id].tokens == plain[request.id].tokens, request.id
        np.testing.assert_allclose(cached[request.id].logprobs, plain[request.id].logprobs,
                                   rtol=1e-5, atol=1e-5)
    # Request 0 prefills from scratch; 1, admitted with it, waits for its prefill and shares 15
    # tokens (its last is computed): a full page and 7 slots of the second, copied on write.
    # Each later one shares the whole 21-token prefix, 5 slots of the third page copied.
    hits = {r.id: cached[r.id].cached_tokens for r in requests}
    assert hits == {0: 0, 1: 15, 2: 21, 3: 0, 4: 21, 5: 15, 6: 21, 7: 21}
    assert engine.pool.used == 0 and engine.pool.idle > 0
    engine.pool.check()


@pytest.mark.slow
def test_prefix_cache_races_preemption_and_eviction(tiny):
    """A tight pool, 4 slots, chunked prefill, shared prefixes, a seeded random order of
    arrivals and random steps per call: requests are preempted, idle pages evicted and pages
    shared; after every call no page someone reads is free or idle, each slot's device table
    lists exactly its own pages, and every request ends with the tokens of the no-cache run;
    partly read pages are copied on write among all this."""
    rng = np.random.default_rng(6)
    requests = [shared_prefix_requests(12, seed=3)[i] for i in rng.permutation(12)]
    options = EngineOptions(prefill_chunk=8)
    plain = SlotEngine(tiny, 4, S, kv_tokens=16 * S, page_size=8,
                       options=options).run(requests, n=2)
    engine = SlotEngine(tiny, 4, S, kv_tokens=96, page_size=8, options=options,
                        prefix_cache=True)
    queue, done, preempted = list(requests), {}, 0
    while queue or engine.active:
        for _ in range(int(rng.integers(0, engine.room(queue) + 1)) if engine.active else
                       engine.room(queue)):
            engine.insert(queue.pop(0))
        result = engine.step(int(rng.integers(1, 4)))
        preempted += len(result.preempted)
        queue[:0] = result.preempted
        done |= {c.request_id: c for c in result.finished}
        pool = engine.pool
        pool.check()
        table = np.asarray(engine.state.cache.table)
        for slot in range(engine.num_slots):
            held = pool.pages(slot)
            assert table[slot, :len(held)].tolist() == held
            assert (table[slot, len(held):] == pool.num_pages).all()
    assert preempted > 0 and engine.pool.evictions > 0 and engine.pool.copies > 0
    assert sum(c.cached_tokens > 0 for c in done.values()) >= 4
    prompts = {r.id: len(r.prompt) for r in requests}  # a resumed request shares its own pages:
    assert any(c.cached_tokens > prompts[i] for i, c in done.items())  # past its prompt
    assert {i: c.tokens for i, c in done.items()} == {i: c.tokens for i, c in plain.items()}
    assert engine.pool.used == 0


# --- n samples per request (issue 37) ---------------------------------------------------------

SAMPLE_PROMPT = list(range(3, 22))  # 19 tokens: two full pages of 8 and three tokens more


@pytest.fixture(scope="module")
def sample_reference(tiny):
    """Sample i of ``generate(..., n=4)`` on the prompt alone, as token lists."""
    out = dl.generate(tiny, [SAMPLE_PROMPT], SAMPLED, 12, seed=[7], n=4,
                      options=dl.DecodeOptions(max_len=S))
    return [out.tokens[0, i, :out.lengths[0, i]].tolist() for i in range(4)]


@pytest.mark.parametrize("paged", [False, True])
def test_engine_samples_equal_generate_n(tiny, sample_reference, paged):
    """A request of n=4 samples gives ``generate(..., n=4)``'s samples, keyed (id, i); sample 0
    equals an n=1 request of the same seed; on pages, samples 1..3 share sample 0's prompt
    pages but its last token (two full pages, the third copied on write) and compute only
    that token."""
    memory = {"kv_tokens": 16 * S, "page_size": 8} if paged else {}
    engine = SlotEngine(tiny, 4, S, **memory)
    done = engine.run([Request("a", SAMPLE_PROMPT, 12, SAMPLED, seed=7, n=4),
                       Request("b", SAMPLE_PROMPT, 12, SAMPLED, seed=7)], n=3)
    assert sorted(done, key=str) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), "b"]
    assert len({tuple(t) for t in sample_reference}) == 4  # independent draws, not copies
    for i, tokens in enumerate(sample_reference):
        assert done[("a", i)].tokens == tokens and done[("a", i)].sample == i
    assert done["b"].tokens == sample_reference[0] and done["b"].key == "b"
    assert [done[("a", i)].cached_tokens for i in range(4)] == [0] + [18 * paged] * 3
    if paged:
        engine.pool.check()
        assert engine.pool.used == 0


def test_n_samples_hold_fewer_pages_than_separate_requests(tiny):
    """Four samples of one prompt hold 4 + 3 x 2 pages at their peak (the prompt's two full
    pages shared), four separate requests 4 x 4; no page is lost either way."""
    def peak(requests):
        engine, queue, most = SlotEngine(tiny, 4, S, kv_tokens=16 * S, page_size=8), requests, 0
        while queue or engine.active:
            for _ in range(engine.room(queue)):
                engine.insert(queue.pop(0))
            engine.step(3)
            most = max(most, engine.pool.used)
        engine.pool.check()
        assert engine.pool.used == 0
        return most

    shared = peak([Request("a", SAMPLE_PROMPT, 12, SAMPLED, seed=7, n=4)])
    separate = peak([Request(i, SAMPLE_PROMPT, 12, SAMPLED, seed=i) for i in range(4)])
    assert (shared, separate) == (10, 16)


def test_samples_under_preemption_and_replay_records(tiny, sample_reference):
    """A tight pool preempts requests of several samples together and resumes only the samples
    that were running: every sample still ends with generate's tokens, and a replay keeps one
    record per sample in trace order."""
    trace = [Request(i, SAMPLE_PROMPT, 12, SAMPLED, seed=7, n=(2, 1)[i % 2], arrival=0.0)
             for i in range(4)]
    out = replay(SlotEngine(tiny, 4, S, kv_tokens=72, page_size=8), trace, Continuous(),
                 clock=VirtualClock(1.0), steps_per_call=3)
    assert [(r.request_id, r.sample) for r in out.records] == [
        (0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert out.summary["preemptions"] > 0
    for record in out.records:
        assert record.status == "completed"
        assert record.tokens == sample_reference[record.sample], record


def test_bad_sample_counts_are_refused(tiny):
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match="n must be"):
            Request(0, [1, 2], 4, n=bad)
    engine = SlotEngine(tiny, 4, S, kv_tokens=64, page_size=8)
    assert "n=5 samples need 5 slots" in engine.check(Request(0, [1, 2], 4, n=5))
    assert "more than the whole pool" in engine.check(Request(0, SAMPLE_PROMPT, 12, n=4))
    with pytest.raises(ValueError, match="cannot be served: n=5"):
        engine.run([Request(0, [1, 2], 4, n=5)])
