"""SlotEngine: every request's tokens equal ``generate`` on that request alone, whatever its slot,
batch-mates, steps per call or the processors of the requests before it; a reused slot holds
nothing of its previous request; requests that cannot fit are refused, any valid parameters are
served; one compiled step serves every mix of requests."""

import collections

import jax
import numpy as np
import pytest
from flax import nnx
from standins import Pieces, padded_next_token

import decodelab as dl
from decodelab.measure import compiles
from decodelab.serving import EngineOptions, Request, SlotEngine, slot_prefill

S = 64  # slot capacity = the tiny model's position table
GREEDY = dl.SamplingParams.greedy()
SAMPLED = dl.SamplingParams(temperature=0.9, top_k=40, top_p=0.95)


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


def make_requests(n: int = 8) -> list[Request]:
    """Mixed prompt lengths (one prefill bucket), two budgets, greedy and seeded sampling."""
    rng = np.random.default_rng(1)
    return [Request(id=i, prompt=rng.integers(0, 512, int(rng.integers(1, 15))).tolist(),
                    max_new_tokens=(6, 11)[i % 2], params=(GREEDY, SAMPLED)[(i // 2) % 2],
                    seed=1000 + 7 * i)
            for i in range(n)]


def alone(model, request: Request):
    return dl.generate(model, [list(request.prompt)], request.params, request.max_new_tokens,
                       seed=[request.seed],
                       options=dl.DecodeOptions(stop_sequences=request.stop_sequences, max_len=S))


@pytest.fixture(scope="module")
def reference(tiny):
    """Each request's output from ``dl.generate`` on that request alone."""
    return {r.id: alone(tiny, r) for r in make_requests()}


@pytest.mark.parametrize("slots,n", [(1, 1), (3, 4)])
def test_tokens_equal_generate_alone_for_any_slot_count_and_steps_per_call(tiny, reference,
                                                                           slots, n):
    done = SlotEngine(tiny, slots, S).run(make_requests(), n=n)
    for request_id, ref in reference.items():
        assert done[request_id].tokens == ref.token_lists()[0]
        assert done[request_id].finish_reason == ref.finish_reason[0]
        np.testing.assert_allclose(done[request_id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=0, atol=1e-5)


def test_tokens_do_not_depend_on_batch_mates_or_order(tiny, reference):
    requests = make_requests()
    done = SlotEngine(tiny, 3, S).run(requests[::-1][:5], n=3)
    for request_id, completion in done.items():
        assert completion.tokens == reference[request_id].token_lists()[0]


def test_step_n_is_n_single_steps(tiny):
    one, many = SlotEngine(tiny, 3, S), SlotEngine(tiny, 3, S)
    for engine in (one, many):
        for r in make_requests(3):
            engine.insert(r)
    for _ in range(4):
        one.step(1)
    many.step(4)
    # Every field but the scalar round counter (which no slot reads) is identical.
    for a, b in zip(jax.tree.leaves(one.state.replace(step=0)),
                    jax.tree.leaves(many.state.replace(step=0))):
        np.testing.assert_array_equal(a, b)


def row(state, slot: int):
    """The per-row fields of one slot, and its cache keys and values below its length (the
    slots past it are stale: never attended, overwritten by the next write)."""
    fields = {name: jax.tree.map(lambda x: x[slot], getattr(state, name))
              for name in slot_prefill.ROW_FIELDS}
    length = int(state.cache.lengths[slot])
    return (fields, state.cache.k[:, slot, :, :length], state.cache.v[:, slot, :, :length],
            state.cache.lengths[slot])


def test_a_reused_slot_holds_nothing_of_its_previous_request(tiny):
    first, second = make_requests(4)[3], make_requests(4)[0]  # long sampled, then short greedy
    reused = SlotEngine(tiny, 3, S)
    reused.insert(first, slot=1)
    while reused.active:
        reused.step(5)
    assert reused.free_slots == [0, 1, 2]
    reused.insert(second, slot=1)
    assert reused.prefill() == 0
    fresh = SlotEngine(tiny, 3, S)
    fresh.insert(second, slot=1)
    fresh.prefill()
    # Every per-row field of slot 1 (tokens, cache keys and values, lengths, parameters, seed,
    # stop sequences, budget, log-probs) is bit-identical to a fresh engine's.
    for a, b in zip(jax.tree.leaves(row(reused.state, 1)), jax.tree.leaves(row(fresh.state, 1))):
        np.testing.assert_array_equal(a, b)
    assert reused.step(6).finished[0].tokens == fresh.step(6).finished[0].tokens


def test_per_request_stop_sequence(tiny, reference):
    base = make_requests()[1]  # greedy, budget 11
    tokens = reference[1].token_lists()[0]
    request = Request(id="stop", prompt=base.prompt, max_new_tokens=11, params=GREEDY,
                      seed=base.seed, stop_sequences=(tuple(tokens[3:5]), (511, 510, 509)))
    ref = alone(tiny, request)
    done = SlotEngine(tiny, 3, S).run([request, make_requests()[2]], n=4)
    end = next(k for k in range(2, 12) if tokens[k - 2:k] == tokens[3:5])  # first occurrence
    assert done["stop"].tokens == ref.token_lists()[0] == tokens[:end]
    assert done["stop"].finish_reason == "stop" == ref.finish_reason[0]
    assert done[2].tokens == reference[2].token_lists()[0]  # its batch-mate has no stop sequence


def test_eos_ends_a_request(tiny, reference):
    tokens = reference[1].token_lists()[0]
    engine = SlotEngine(tiny, 3, S, options=EngineOptions(eos_ids=[tokens[2]]))
    done = engine.run([make_requests()[1]])
    assert done[1].tokens == tokens[:tokens.index(tokens[2]) + 1]
    assert done[1].finish_reason == "eos"


def test_a_request_over_the_slot_capacity_is_refused_with_a_reason(tiny):
    engine = SlotEngine(tiny, 2, S)
    too_long = Request(id="big", prompt=[1] * 40, max_new_tokens=25)
    assert "40 tokens) + max_new_tokens (25) = 65 exceeds the slot capacity max_len=64" in (
        engine.check(too_long))
    with pytest.raises(ValueError, match="cannot be served"):
        engine.insert(too_long)
    assert engine.check(Request(id="fits", prompt=[1] * 40, max_new_tokens=24)) is None
    assert "token id 512" in engine.check(Request(id="v", prompt=[512], max_new_tokens=2))
    assert engine.free_slots == [0, 1]


def test_run_refuses_repeated_request_ids_before_anything_runs(tiny):
    engine = SlotEngine(tiny, 2, S)
    before = engine.state
    requests = make_requests(3) + [Request(id=1, prompt=[5, 6], max_new_tokens=2)]
    with pytest.raises(ValueError, match=r"request ids must be unique, got \[1\] more than once"):
        engine.run(requests)
    assert engine.free_slots == [0, 1] and engine.state is before  # nothing inserted or stepped


def test_insert_and_run_refuse_an_id_that_is_already_decoding(tiny):
    engine = SlotEngine(tiny, 2, S)
    engine.insert(Request(id="a", prompt=[1, 2], max_new_tokens=4))
    again = Request(id="a", prompt=[3], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"request id 'a' is already decoding in slot 0"):
        engine.insert(again)
    with pytest.raises(ValueError, match=r"request ids must be unique, got \['a'\]"):
        engine.run([again])
    assert list(engine.active) == [0]


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_slots=0, max_len=S), "num_slots must be an int >= 1, got 0"),
    (dict(num_slots=2.0, max_len=S), "num_slots must be an int >= 1"),
    (dict(num_slots=2), "max_len must be given for a model without a position table"),
    (dict(num_slots=2, max_len=1), "max_len must be an int >= 2, got 1"),
    (dict(num_slots=2, max_len=S, options=EngineOptions(eos_ids=[600])),
     "eos_ids must be token ids in"),
    (dict(num_slots=2, max_len=S, options={"prefill_chunk": 8}),
     "options must be an EngineOptions, got \\{'prefill_chunk': 8\\}"),
    (dict(num_slots=2, max_len=S, options=EngineOptions(tokenizer=Pieces(513))),
     "options.tokenizer has 513 ids but the model's vocabulary has 512"),
])
def test_bad_engine_arguments(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SlotEngine(tiny, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(eos_ids="2"), "eos_ids must be an int or a list of ints, got '2'"),
    (dict(eos_ids=[1, -1]), "eos_ids must be token ids \\(ints >= 0\\), got -1"),
    (dict(max_stop_sequences=-1), "max_stop_sequences must be an int >= 0, got -1"),
    (dict(max_stop_width=0), "max_stop_width must be an int >= 1, got 0"),
    (dict(prefill_chunk=0), "prefill_chunk must be None \\(whole prompts\\) or an int >= 1, got 0"),
])
def test_bad_engine_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineOptions(**kwargs)


def test_the_engines_tokenizer_masks_a_padded_vocabulary():
    """The padding's logits are the largest; with the engine's tokenizer no greedy or sampled
    request ever picks it."""
    engine = SlotEngine(padded_next_token(640, 600), 2, 16,
                        options=EngineOptions(tokenizer=Pieces(600)))
    done = engine.run([Request(id=0, prompt=(596,), max_new_tokens=6),
                       Request(id=1, prompt=(596,), max_new_tokens=6,
                               params=dl.SamplingParams(temperature=1.0))])
    assert done[0].tokens == [597, 598, 599, 0, 1, 2]  # past 599 the lowest id, 0
    assert len(done[1].tokens) == 6 and max(done[1].tokens) < 600


def test_bad_insert_and_step_arguments(tiny):
    engine = SlotEngine(tiny, 1, S)
    with pytest.raises(ValueError, match="step|n must be an int >= 1"):
        engine.step(0)
    engine.insert(make_requests(1)[0])
    with pytest.raises(ValueError, match="no free slot"):
        engine.insert(make_requests(2)[1])
    with pytest.raises(ValueError, match="request must be a Request"):
        engine.insert([1, 2, 3])


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompt=[]), "prompt is empty; it needs at least one token"),
    (dict(prompt="abc"), "prompt must be a list of token ids"),
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1, got 0"),
    (dict(seed=-1), "seed must be an int in"),
    (dict(arrival=-0.5), "arrival must be a finite number"),
    (dict(stop_sequences=[[]]), r"stop_sequences\[0\] is empty"),
])
def test_bad_request_fields(kwargs, match):
    fields = dict(id=0, prompt=[1, 2], max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=match):
        Request(**fields)


def test_new_requests_reuse_the_compiled_programs(tiny):
    """Prompt lengths within a bucket, parameter values (which processors are on included),
    seeds, budgets and stop sequences are array values: after a warm-up on greedy requests,
    serving requests with any processors compiles none of the engine's programs again (eager
    helper ops such as the gather of finished rows are not counted)."""
    counts = collections.Counter()

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            counts[kwargs.get("fun_name")] += 1

    # Warm: every program once (three requests in two slots: prefills of two prompts and of one).
    SlotEngine(tiny, 2, S).run(
        [Request(id=i, prompt=[1 + i, 2], max_new_tokens=3) for i in range(2)]
        + [Request(id=2, prompt=[3, 4], max_new_tokens=2)], n=3)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        rng = np.random.default_rng(5)
        requests = [Request(id=i, prompt=rng.integers(0, 512, int(rng.integers(1, 16))).tolist(),
                            max_new_tokens=int(rng.integers(1, 20)),
                            params=dl.SamplingParams(temperature=float(rng.uniform(0.01, 1.5)),
                                                     top_k=int(rng.integers(0, 50)),
                                                     top_p=(1.0, 0.9)[i % 2],
                                                     min_p=(0.0, 0.1)[i // 3],
                                                     repetition_penalty=(1.0, 1.2)[i // 2 % 2]),
                            seed=i, stop_sequences=[[int(rng.integers(0, 512))]] * (i % 2))
                    for i in range(6)]
        SlotEngine(tiny, 2, S).run(requests, n=int(rng.integers(1, 5)))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    programs = ("prefill_rows", "_advance_loop", "harvest")
    assert all(counts[name] == 0 for name in programs), counts


def test_greedy_then_top_k_then_top_p_requests_run_one_program_and_equal_generate(tiny):
    """One engine admits greedy requests, then top-k ones beside greedy, then top-p ones beside
    top-k: each program compiles once (5 slots of 40: no other test compiles these programs;
    every run prefills two prompts of one bucket together, so the prefill's shape is the same
    throughout), and every request gets exactly the tokens and log-probabilities ``generate``
    gives it alone."""
    def request(i, params):
        return Request(id=i, prompt=[1 + i, 2, 3], max_new_tokens=6, params=params, seed=i)

    top_k = dl.SamplingParams(temperature=0.7, top_k=9)
    top_p = dl.SamplingParams(temperature=1.1, top_p=0.8)
    runs = [[request(0, GREEDY), request(1, GREEDY)], [request(2, top_k), request(3, GREEDY)],
            [request(4, top_p), request(5, top_k.replace(top_k=3))]]
    programs = ("prefill_rows", "_advance_loop", "harvest")
    engine, done = SlotEngine(tiny, 5, 40), {}
    with compiles.count_compiles() as counts:
        for run in runs:
            done |= engine.run(run)
    assert {name: counts[name] for name in programs} == dict.fromkeys(programs, 1), counts
    for request in (r for run in runs for r in run):
        ref = dl.generate(tiny, [list(request.prompt)], request.params, request.max_new_tokens,
                          seed=[request.seed], options=dl.DecodeOptions(max_len=40))
        assert done[request.id].tokens == ref.token_lists()[0]
        np.testing.assert_allclose(done[request.id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=0, atol=1e-5)


def test_a_sampled_request_joining_a_greedy_one_keeps_both_their_tokens(tiny):
    """A greedy request with a presence penalty decodes 3 tokens alone (its output counts carried
    in the state: the counts of those tokens); a sampled request with a repetition penalty and
    min-p joins. Both give the tokens ``generate`` gives each alone."""
    first = Request(id="greedy", prompt=[5, 17, 5, 300], max_new_tokens=12,
                    params=dl.SamplingParams(temperature=0.0, presence_penalty=0.8), seed=3)
    second = Request(id="sampled", prompt=[9, 9, 40], max_new_tokens=9, seed=4,
                     params=dl.SamplingParams(temperature=0.9, repetition_penalty=1.3,
                                              min_p=0.05))
    engine = SlotEngine(tiny, 2, S)
    engine.insert(first)
    assert engine.step(3).generated == {"greedy": 3}
    state = engine.state
    output = np.asarray(state.tokens[0, len(first.prompt):int(state.lengths[0])])
    np.testing.assert_array_equal(state.output_counts[0], np.bincount(output, minlength=512))
    np.testing.assert_array_equal(
        np.flatnonzero(state.seen[0]), np.unique([*first.prompt, *output.tolist()]))
    engine.insert(second)
    done = engine.run([])
    for request in (first, second):
        ref = alone(tiny, request)
        assert done[request.id].tokens == ref.token_lists()[0]
        np.testing.assert_allclose(done[request.id].logprobs, ref.logprobs[0, :ref.lengths[0]],
                                   rtol=0, atol=1e-5)


def test_any_engine_serves_requests_with_any_processors(tiny):
    """There is no set of processors an engine is built for: a greedy engine's check accepts a
    sampled request (every processor on), and one with one value per processor but two rows'
    worth of values is refused with the parameter's reason."""
    engine = SlotEngine(tiny, 2, S)
    engine.insert(Request(id=0, prompt=[1], max_new_tokens=2))
    everything = dl.SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05,
                                   typical_p=0.9, repetition_penalty=1.2, no_repeat_ngram_size=2)
    assert engine.check(Request(id=1, prompt=[1], max_new_tokens=2, params=everything)) is None
    assert engine.check(Request(id=2, prompt=[1], max_new_tokens=2,
                                params=dl.SamplingParams(top_k=[1, 2]))) == (
        "params: top_k has 2 values but the batch has 1 rows; give one value or one per row")
