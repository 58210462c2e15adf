"""The paged-memory study: its sweep (the same KV memory for every arm), its warm-up (after which a
replay on paged memory, preemptions included, compiles none of the engine's programs), real tiny
points of every arm, the page rendered from them, and the roofline prediction against a
hand-computed case."""

import math
import types

import numpy as np
import pytest
from flax import nnx
from study_config import config_module

import decodelab as dl
from decodelab import experiment, serving
from decodelab.experiment import runner
from decodelab.measure import compiles

PROGRAMS = ("prefill_rows", "_advance_loop", "advance_rows", "harvest", "replan")
TINY = {"model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2, "model.n_kv_heads": 2,
        "model.d_ff": 64, "model.max_seq_len": 128, "vocab_size": 256, "memory_tokens": 256,
        "page_size": 8, "paged_slots": 16, "replays": 2, "trace.num_requests": 12,
        "step_calls": 3, "max_len": 64}


@pytest.fixture(scope="module")
def study():
    from experiments import paged

    return paged


class _Context:
    def __init__(self, workdir):
        self.workdir, self.show_progress = workdir, False

    def status(self, text):
        del text


def test_the_sweep_gives_every_arm_the_same_memory(study):
    module = config_module("paged")
    points = experiment.expand(module.get_config(), module.get_sweep())
    arms = [p.config for p in points if p.config.arm != "step"]
    assert len(arms) == 24 and {c.arm for c in arms} == {"static", "continuous", "paged"}
    for c in arms:
        assert c.max_len % c.page_size == 0 and c.max_len <= c.model.max_seq_len
        assert study.padded_slots(c) * c.max_len <= c.memory_tokens
        trace = study.make_trace(c, 0)
        assert max(len(r.prompt) + r.max_new_tokens for r in trace) <= c.max_len
    assert [study.padded_slots(c) for c in arms if c.arm == "static" and c.trace.rate == 64] == [
        21, 11, 6, 3]


def test_after_the_warm_up_a_paged_replay_with_preemptions_compiles_nothing(study, tiny_config):
    module = config_module("paged")
    config = experiment.apply_overrides(module.get_config(), {
        **TINY, "arm": "paged", "max_len": 64, "memory_tokens": 128, "trace.rate": 1000.0})
    model = dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))
    trace = study.make_trace(config, 0)
    study.warm_up(model, config, trace)
    with compiles.count_traces() as counts:
        result = serving.replay(study._engine(model, config), trace, serving.Continuous(),
                                clock=serving.VirtualClock(1.0), steps_per_call=2)
    assert result.summary["preemptions"] > 0 and result.summary["completed"] == 12
    assert {name: counts[name] for name in PROGRAMS} == dict.fromkeys(PROGRAMS, 0)


@pytest.fixture(scope="module")
def rows(study, tmp_path_factory):
    module = config_module("paged")
    workdir = tmp_path_factory.mktemp("paged")
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    out = []
    points = [{"arm": arm, "max_len": 64, "trace.rate": 200.0}
              for arm in ("static", "continuous", "paged")]
    points += [{"arm": "step", "step_batch": b} for b in (2, 16)]
    for i, point in enumerate(points):
        config = experiment.apply_overrides(module.get_config(), {**TINY, **point})
        metrics = study.evaluate(config, _Context(workdir))
        # What the runner stores: numbers, lists of numbers, dicts of lists (else it raises).
        runner._check_metrics(metrics, experiment.expand(config, [{}])[0])
        out.append(dict(experiment="paged", config_hash=str(i), seed=0, sweep_index=i,
                        overrides=point, start_time="2026-01-01T00:00:00+00:00",
                        provenance=provenance, config=config.to_dict(), metrics=metrics,
                        wall_time_s=1.0))
    return out


def test_the_arms_rows(rows):
    static, continuous, paged, small, big = (r["metrics"] for r in rows)
    assert static["slots"] == continuous["slots"] == 4 and paged["slots"] == 16
    for m in (static, continuous, paged):
        assert m["completed"] == 12 and len(m["replay_output_tokens_per_s"]) == 2
        assert m["per_request_tokens"] == static["per_request_tokens"]  # the same requests
    assert paged["mean_running"] > continuous["mean_running"]
    assert small["batch"] == 2 and big["batch"] == 16 and len(big["step_s_all"]) == 3


def test_the_page_renders_from_the_rows(study, rows, tmp_path):
    written = study.report(rows, tmp_path)
    page = (tmp_path / "paged.md").read_text()
    assert "**The decomposition at saturation (200 requests/s)**" in page
    assert "| 64 |" in page and "**Targets.**" in page
    assert "**The decomposition predicted for the published benchmark**" in page
    assert tmp_path / "paged_throughput.png" in written
    assert "| paged batch, pool 96% full | memory, full pool | predicted total, full pool |" in page


def test_the_memory_factor_is_read_against_what_rounds_of_each_batch_cost(study, rows, tmp_path):
    """The reading caps each arm's tokens/s by its rounds alone: (b) decodes all its padded
    slots, (c) its occupied slots rounded up to a power of two; seconds per round interpolated
    between the `step` points."""
    _, continuous, paged, small, big = (r["metrics"] for r in rows)
    study.report(rows, tmp_path)
    text = (tmp_path / "paged.md").read_text()
    steps = {2: small["step_s"], 16: big["step_s"]}

    def round_s(batch):
        return float(np.interp(batch, sorted(steps), [steps[b] for b in sorted(steps)]))

    bucket = 1 << (math.ceil(paged["mean_running"]) - 1).bit_length()
    cap_b = continuous["mean_running"] / round_s(continuous["slots"])
    cap_c = paged["mean_running"] / round_s(bucket)
    assert (f"cap (b) at {cap_b:.0f} and (c) at {cap_c:.0f} output tokens/s "
            f"({cap_c / cap_b:.2f}x)") in text
    assert f"({bucket} rows at its mean of {paged['mean_running']:.1f} running" in text
    assert f"pool occupancy over the run was {paged['page_occupancy']:.2f}" in text


def test_the_roofline_prediction_against_a_hand_computed_case(study):
    # 1 GB of weights, KV 1 MB per token, 3 GB of KV memory (3000 tokens), 1000 GB/s; requests of
    # a 100-token prompt reserving 1000 tokens: 3 padded slots. Mean output 400: a request holds
    # 100 + 200 = 300 tokens on average, so at occupancy 0.9 the pool runs 9 requests.
    published = types.SimpleNamespace(params=0.5e9, bytes_per_value=2, n_layers=1,
                                      d_model=250_000, gpu_memory_gb=5.0, workspace_gb=1.0,
                                      prompt=100, output_cap=900, bandwidth_gbs=1000.0)
    pred = study.roofline_prediction(published, 400.0, 0.9)
    assert pred["kv_tokens"] == pytest.approx(3000) and pred["padded_batch"] == 3
    assert pred["paged_batch"] == pytest.approx(9.0)
    step = lambda b: (1e9 + b * 300 * 1e6) / 1e12  # noqa: E731
    assert pred["memory"] == pytest.approx((9 / step(9)) / (3 / step(3)))
    assert pred["product"] == pytest.approx(pred["scheduling"] * pred["memory"])
    assert pred["ratio"] == pytest.approx(2.0)


def test_static_waste_against_known_cases(study):
    # A batch of one wastes nothing; outputs nearly all at a cap far below the mean waste
    # almost nothing.
    assert study.static_waste(50.0, 1000, 1) == pytest.approx(1.0)
    assert study.static_waste(1e6, 10, 8) == pytest.approx(1.0, rel=1e-4)  # a rare draw < 10
    # Uncapped exponential: E[max of n] / E[X] = H_n, the n-th harmonic number.
    assert study.static_waste(1000.0, 10**9, 4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4,
                                                                  rel=0.02)
    assert np.isfinite(study.static_waste(256.0, 1536, 7))
