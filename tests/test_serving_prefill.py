"""SlotEngine prefill: the prompts waiting at an engine call enter together in one compiled call,
written straight into their slots' rows of the shared cache (in place: no fresh cache, no copy of
a cache-sized buffer); chunked prefill gives the tokens unchunked prefill gives, which are each
request's tokens alone; a long prompt's chunks interleave with the decode rounds of the running
slots; an engine call reads the device once."""

import math

import jax
import numpy as np
import programs
import pytest
from flax import nnx

import decodelab as dl
from decodelab.serving import EngineOptions, Request, SlotEngine, slot_prefill

S = 64  # slot capacity
GREEDY = dl.SamplingParams.greedy()
SAMPLED = dl.SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
PROMPT_LENGTHS = (37, 5, 23, 50, 12, 30)  # several chunks each for most chunk sizes below


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


def long_requests() -> list[Request]:
    """Prompts of 5 to 50 tokens, greedy and seeded sampling alternating, two budgets."""
    rng = np.random.default_rng(3)
    return [Request(id=i, prompt=rng.integers(0, 512, n).tolist(), max_new_tokens=(6, 9)[i % 2],
                    params=(GREEDY, SAMPLED)[i % 2], seed=500 + i)
            for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def reference(tiny):
    """Each request's output from ``dl.generate`` on that request alone."""
    return {r.id: dl.generate(tiny, [list(r.prompt)], r.params, r.max_new_tokens, seed=[r.seed],
                              options=dl.DecodeOptions(max_len=S)) for r in long_requests()}


@pytest.fixture(scope="module")
def unchunked(tiny):
    return SlotEngine(tiny, 3, S).run(long_requests(), n=3)


def test_unchunked_prefill_gives_each_request_its_tokens_alone(unchunked, reference):
    for request_id, ref in reference.items():
        assert unchunked[request_id].tokens == ref.token_lists()[0]
        np.testing.assert_allclose(unchunked[request_id].logprobs,
                                   ref.logprobs[0, :ref.lengths[0]], rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [8, 24])  # the short-block (blocked) and the full attention
def test_chunked_prefill_gives_the_tokens_of_unchunked_and_of_generate_alone(tiny, unchunked,
                                                                           reference, chunk):
    engine = SlotEngine(tiny, 3, S, options=EngineOptions(prefill_chunk=chunk))
    done = engine.run(long_requests(), n=3)
    for request_id, ref in reference.items():
        assert done[request_id].tokens == unchunked[request_id].tokens == ref.token_lists()[0]
        assert done[request_id].finish_reason == ref.finish_reason[0]
        np.testing.assert_allclose(done[request_id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=0, atol=1e-5)


def test_the_prompts_waiting_at_a_call_are_prefilled_in_one_call(tiny, reference, monkeypatch):
    """Three prompts inserted before a call enter as one block of 4 rows (3 rounded up to a power
    of two; the padding row's index, 4, is past the slots and writes nothing) and 64 columns
    (37 rounded up)."""
    calls = []
    prefill_rows = slot_prefill.prefill_rows

    def spy(weights, state, chunk, **static):
        calls.append((chunk.block.shape, chunk.rows.tolist(), chunk.counts.tolist(), static))
        return prefill_rows(weights, state, chunk, **static)

    monkeypatch.setattr(slot_prefill, "prefill_rows", spy)
    engine = SlotEngine(tiny, 4, S)
    for request in long_requests()[:3]:
        engine.insert(request)
    engine.step(2)
    assert len(calls) == 1
    shape, rows, counts, static = calls[0]
    assert (shape, rows, counts, static["reach"]) == ((4, 64), [0, 1, 2, 4], [37, 5, 23, 0], 64)
    done = engine.run([])
    assert len(calls) == 1
    for request_id in range(3):
        assert done[request_id].tokens == reference[request_id].token_lists()[0]


def test_a_long_prompt_enters_in_chunks_between_decode_rounds(tiny):
    """With chunks of 8, a 37-token prompt takes 5 engine calls (8 + 8 + 8 + 8 + 5 tokens); the
    request already decoding gets its token in each of them, and the long one its first token in
    the call of its last chunk."""
    engine = SlotEngine(tiny, 2, S, options=EngineOptions(prefill_chunk=8))
    engine.insert(Request(id="short", prompt=[4, 5, 6], max_new_tokens=20))
    assert engine.step(1).generated == {"short": 1}
    engine.insert(long_requests()[0])
    seen = []
    for _ in range(5):
        result = engine.step(1)
        seen.append((result.generated["short"], result.generated[0], engine.prefilling))
    assert seen == [(2, 0, [1]), (3, 0, [1]), (4, 0, [1]), (5, 0, [1]), (6, 1, [])]


def captured_prefill(model, num_slots: int, max_len: int, prompt: int, chunk: int | None,
                     call: int) -> tuple:
    """The arguments of the engine's ``call``-th prefill of one ``prompt``-token request, for
    ``slot_prefill.prefill_rows(weights, state, chunk, **static)``."""
    captured = []

    def capture(weights, state, chunk, **static):
        captured.append((weights, state, chunk, static))
        return state

    engine = SlotEngine(model, num_slots, max_len, options=EngineOptions(prefill_chunk=chunk))
    engine.insert(Request(id=0, prompt=list(range(1, prompt + 1)), max_new_tokens=4), slot=2)
    prefill_rows = slot_prefill.prefill_rows
    slot_prefill.prefill_rows = capture
    try:
        for _ in range(call):
            engine.prefill()
    finally:
        slot_prefill.prefill_rows = prefill_rows
    return captured[-1]


@pytest.mark.parametrize("chunk,call,reach", [(None, 1, 64), (32, 2, 512)],
                         ids=["whole-prompt", "second-chunk"])
def test_prefill_writes_the_slot_rows_in_place_without_a_cache_sized_buffer(tiny, chunk, call,
                                                                           reach):
    """4 slots of 512, one 50-token prompt: the cache's keys and values are updated in place
    (the compiled prefill reuses at least their bytes of its donated state, which the rest of the
    state alone cannot reach); no equation but the in-place writes makes an array of cache rows as
    large as one layer of the cache's keys, and none holds every layer's (no fresh cache, no copy
    of the prefilled rows). A whole prompt reads the 64 slots of its block, not the row's 512; a
    later chunk (32 tokens from slot 32) the row."""
    cfg = tiny.config
    K, H = cfg.n_kv_heads, cfg.head_dim
    B, max_len = 4, 512
    weights, state, prefill_chunk, static = captured_prefill(tiny, B, max_len, 50, chunk, call)
    cache = state.cache
    keys_and_values = cache.k.nbytes + cache.v.nbytes  # [L, B, K, S, H] each
    assert sum(leaf.nbytes for leaf in jax.tree.leaves(state)) - keys_and_values < cache.k.nbytes
    memory = programs.compiled_memory(slot_prefill.prefill_rows, weights, state, prefill_chunk,
                                      **static)
    assert memory.alias_size_in_bytes >= keys_and_values
    found = programs.equations(slot_prefill.prefill_rows, weights, state, prefill_chunk, **static)
    made = [(e.primitive, t.shape) for e in found if not e.calls for t in e.output_types
            if t.shape[-3:] == (K, max_len, H)]  # arrays of cache rows [..., K, S, H]
    writes = ("scatter", "dynamic_update_slice")
    layer = B * K * max_len * H
    assert [(p, shape) for p, shape in made if p not in writes and math.prod(shape) >= layer] == []
    assert [(p, shape) for p, shape in made if p not in writes and shape[0] == cfg.n_layers
            and len(shape) == 5] == []
    reads = {t.shape[-2] for e in found if e.primitive in ("gather", "dynamic_slice")
             for t in e.output_types if t.shape[-3:-2] == (K,) and t.shape[-1] == H}
    assert max(reads) == reach


def test_an_engine_call_reads_the_device_once(tiny, reference, monkeypatch):
    """Every ``step`` makes exactly one explicit device-to-host transfer and no implicit one (jax's
    transfer guard raises on any implicit read), and waits on nothing else."""
    gets, waits = [], []
    device_get, block_until_ready = jax.device_get, jax.block_until_ready
    monkeypatch.setattr(jax, "device_get", lambda x: gets.append(x) or device_get(x))
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waits.append(x) or block_until_ready(x))
    engine = SlotEngine(tiny, 3, S, options=EngineOptions(prefill_chunk=8))
    queue, done, calls = long_requests(), {}, 0
    with jax.transfer_guard_device_to_host("disallow"):
        while queue or engine.active:
            while queue and engine.free_slots:
                engine.insert(queue.pop(0))
            done |= {c.request_id: c for c in engine.step(3).finished}
            calls += 1
    assert len(gets) == calls and waits == []
    assert all(isinstance(x, jax.Array) for x in gets)  # one array per call
    for request_id, ref in reference.items():
        assert done[request_id].tokens == ref.token_lists()[0]


def test_bad_prefill_chunk_is_refused(tiny):
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=rf"prefill_chunk must be None \(whole prompts\) or "
                                             rf"an int >= 1, got {bad!r}"):
            EngineOptions(prefill_chunk=bad)
    with pytest.raises(ValueError, match=rf"prefill_chunk must be None \(whole prompts\) or an "
                                         rf"int in \[1, max_len={S}\], got {S + 1}"):
        SlotEngine(tiny, 2, S, options=EngineOptions(prefill_chunk=S + 1))
