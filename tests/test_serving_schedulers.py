"""Schedulers and replay: every policy gives every request the tokens of ``generate`` on it alone;
static waits for a full batch, dynamic for a window, continuous for nothing; a request that cannot
fit is rejected with a record while the others complete."""

import pytest
from flax import nnx

import decodelab as dl
from decodelab import serving
from decodelab.serving import Request, SlotEngine

S = 64
SAMPLED = dl.SamplingParams(temperature=0.9, top_k=40, top_p=0.95)


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


def trace(params, num_requests: int = 7) -> list[Request]:
    """Poisson arrivals; budgets 6 or 11 so the reference compiles two decode loops only."""
    base = serving.poisson_trace(num_requests, 200.0, dict(kind="uniform", low=1, high=14),
                                 dict(kind="fixed", length=6), vocab_size=512, seed=3,
                                 params=params, seed_offset=50)
    return [Request(id=r.id, prompt=r.prompt, max_new_tokens=(6, 11)[r.id % 2], params=params,
                    seed=r.seed, arrival=r.arrival) for r in base]


@pytest.mark.parametrize("params", [dl.SamplingParams.greedy(), SAMPLED], ids=["greedy", "sampled"])
def test_every_policy_gives_each_request_its_tokens_alone(tiny, params):
    requests = trace(params)
    expected = {r.id: dl.generate(tiny, [list(r.prompt)], params, r.max_new_tokens, seed=[r.seed],
                                  options=dl.DecodeOptions(max_len=S)).token_lists()[0]
                for r in requests}
    for name in serving.SCHEDULERS:
        for slots, n in ((3, 1), (3, 4)):
            engine = SlotEngine(tiny, slots, S)
            result = serving.replay(engine, requests, serving.make_scheduler(name, slots, 0.01),
                                    steps_per_call=n)
            got = {rec.request_id: rec.tokens for rec in result.records}
            assert got == expected, (name, slots, n)
            assert result.summary["completed"] == len(requests)


def test_a_request_that_cannot_fit_is_rejected_with_a_record_and_the_rest_complete(tiny):
    requests = trace(dl.SamplingParams.greedy(), 4)
    big = Request(id="big", prompt=[1] * 60, max_new_tokens=5, arrival=requests[1].arrival)
    for name in serving.SCHEDULERS:
        result = serving.replay(SlotEngine(tiny, 3, S), requests + [big],
                                serving.make_scheduler(name, 3, 0.01))
        by_id = {r.request_id: r for r in result.records}
        assert by_id["big"].status == "rejected"
        assert "= 65 exceeds the slot capacity max_len=64" in by_id["big"].error
        assert all(by_id[r.id].status == "completed" and by_id[r.id].tokens for r in requests)
        assert result.summary["rejected"] == 1 and result.summary["completed"] == 4


def spaced(n: int, gap: float) -> list[Request]:
    return [Request(id=i, prompt=[1, 2, 3], max_new_tokens=2, arrival=i * gap) for i in range(n)]


def times(result) -> list[tuple[float, float, float, float]]:
    return [(r.arrival, r.admitted, r.first_token, r.finish) for r in result.records]


# On a virtual clock every engine call takes 1 s and nothing else takes time. A request of 2 new
# tokens is one token per call: first token 1 s after admission, finished 2 s after.
def test_static_waits_for_a_full_batch_and_runs_it_to_the_end(tiny):
    result = serving.replay(SlotEngine(tiny, 3, S), spaced(5, 10.0), serving.Static(3),
                            clock=serving.VirtualClock(1.0))
    # The third arrival (t=20) completes the first batch; the last, partial batch starts when
    # the fifth arrives (t=40), since no more will arrive.
    assert times(result) == [(0, 20, 21, 22), (10, 20, 21, 22), (20, 20, 21, 22),
                             (30, 40, 41, 42), (40, 40, 41, 42)]
    assert result.steps == 4
    assert result.idle_skipped_s == 20 + 8 + 10  # 0 -> 20, 22 -> 30, 30 -> 40


def test_dynamic_waits_at_most_its_window(tiny):
    result = serving.replay(SlotEngine(tiny, 3, S), spaced(3, 10.0), serving.Dynamic(3, 2.0),
                            clock=serving.VirtualClock(1.0))
    # Alone in the queue, the first two wait the whole 2 s window; the last goes at once, since
    # nothing more will arrive.
    assert times(result) == [(0, 2, 3, 4), (10, 12, 13, 14), (20, 20, 21, 22)]


def test_continuous_inserts_on_arrival(tiny):
    result = serving.replay(SlotEngine(tiny, 3, S), spaced(3, 10.0), serving.Continuous(),
                            clock=serving.VirtualClock(1.0))
    assert times(result) == [(0, 0, 1, 2), (10, 10, 11, 12), (20, 20, 21, 22)]
    assert result.idle_skipped_s == 8 + 8  # 2 -> 10, 12 -> 20


def test_continuous_fills_a_free_slot_while_others_decode(tiny):
    requests = [Request(id=0, prompt=[1, 2, 3], max_new_tokens=4, arrival=0.0),
                Request(id=1, prompt=[4, 5], max_new_tokens=2, arrival=0.5),
                Request(id=2, prompt=[6], max_new_tokens=2, arrival=0.5)]
    result = serving.replay(SlotEngine(tiny, 2, S), requests, serving.Continuous(),
                            clock=serving.VirtualClock(1.0))
    # Request 0 runs alone 0 -> 1; request 1 joins at t=1 (both slots busy until it finishes at 3);
    # request 2 takes its slot at t=3, while request 0 finishes its 4 tokens at t=4.
    assert times(result) == [(0, 0, 1, 4), (0.5, 1, 2, 3), (0.5, 3, 4, 5)]


def test_chunked_prefill_spreads_a_long_prompt_over_calls_without_stalling_others(tiny):
    requests = [Request(id=0, prompt=[1, 2, 3], max_new_tokens=8, arrival=0.0),
                Request(id=1, prompt=list(range(1, 38)), max_new_tokens=2, arrival=0.5)]
    engine = SlotEngine(tiny, 2, S, options=serving.EngineOptions(prefill_chunk=8))
    result = serving.replay(engine, requests, serving.Continuous(),
                            clock=serving.VirtualClock(1.0))
    # Request 1's 37 prompt tokens enter in 5 chunks of at most 8, in the calls ending at t=2..6,
    # its first token with the last; request 0 gets a token from every call meanwhile.
    assert times(result) == [(0, 0, 1, 8), (0.5, 1, 6, 7)]
    assert result.records[0].deliveries == [1, 2, 3, 4, 5, 6, 7, 8]
    assert result.records[0].max_tbt == 1 and result.summary["tbt_p99_s"] == 1


@pytest.mark.parametrize("call,match", [
    (lambda: serving.make_scheduler("fifo", 2), "scheduler must be one of"),
    (lambda: serving.make_scheduler("static", 0), "num_slots must be an int >= 1, got 0"),
    (lambda: serving.Static(0), "batch_size must be an int >= 1, got 0"),
    (lambda: serving.Dynamic(2, -1.0), "max_wait must be a finite number of seconds >= 0"),
])
def test_bad_scheduler_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_replay_arguments(tiny):
    engine = SlotEngine(tiny, 3, S)
    with pytest.raises(ValueError, match="clock must be a Clock"):
        serving.replay(engine, spaced(1, 1.0), serving.Continuous(), clock=lambda: 0.0)
    with pytest.raises(ValueError, match="step_s must be a finite number of seconds >= 0, got -1"):
        serving.VirtualClock(-1)
    with pytest.raises(ValueError, match="steps_per_call must be an int >= 1, got 0"):
        serving.replay(engine, spaced(1, 1.0), serving.Continuous(), steps_per_call=0)
    with pytest.raises(ValueError, match="trace request ids must be unique"):
        serving.replay(engine, spaced(1, 1.0) * 2, serving.Continuous())
