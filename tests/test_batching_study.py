"""The batching study's pieces: its long-prompt trace, its warm-up (after which a timed replay
compiles none of the engine's programs) and the per-request values its rows keep."""

import pytest
from flax import nnx
from ml_collections import config_dict

import decodelab as dl
from decodelab import compiles, experiment, serving
from study_config import config_module

PROGRAMS = ("prefill_rows", "_advance_loop", "_harvest", "_replan")


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))


def test_the_long_prompt_points_are_continuous_with_whole_and_chunked_prefill():
    module = config_module("batching")
    points = experiment.expand(module.get_config(), module.get_sweep())
    long = [p.config for p in points if p.config.trace.prompts == "long"]
    assert sorted((c.engine.prefill_chunk, c.trace.rate) for c in long) == [
        (0, 6.0), (0, 64.0), (16, 6.0), (16, 64.0), (64, 6.0), (64, 64.0)]
    assert all(c.policy == "continuous" and c.engine.max_len == c.model.max_seq_len == 512
               for c in long)
    # The longest prompt and answer fit a slot.
    assert all(c.trace.prompt_long.cap + c.trace.output_long_tail.cap <= c.engine.max_len
               for c in long)


@pytest.mark.parametrize("chunk", [0, 16])
def test_after_the_warm_up_a_replay_compiles_none_of_the_engine_programs(tiny, chunk):
    from experiments import batching

    engine = config_dict.ConfigDict(dict(num_slots=2, max_len=64, steps_per_call=2,
                                         prefill_chunk=chunk))
    trace = serving.poisson_trace(
        8, 50.0, {"kind": "uniform", "low": 4, "high": 40},
        {"kind": "fixed", "length": 3}, vocab_size=512, seed=0,
        params=dl.SamplingParams(temperature=0.8, top_p=0.95))
    assert max(len(r.prompt) for r in trace) > 32  # three prompt blocks: 16, 32 and 64
    batching.warm_up(tiny, engine, trace)
    with compiles.count_traces() as counts:
        result = serving.replay(batching._engine(tiny, engine), trace, serving.Continuous(),
                                clock=serving.VirtualClock(1.0), steps_per_call=2)
    assert {name: counts[name] for name in PROGRAMS} == dict.fromkeys(PROGRAMS, 0)
    values = serving.per_request(result.records)
    assert values["tokens"] == [3] * 8
    assert [len(v) for v in values.values()] == [8] * 5
