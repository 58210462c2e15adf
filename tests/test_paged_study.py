"""The paged-memory study: its sweep (the same KV memory for every arm), its warm-up (after which a
replay on paged memory, preemptions included, compiles none of the engine's programs), real tiny
points of every arm, its page in the one form rendered from them and from synthetic rows with
known ratios, and the roofline prediction against a hand-computed case."""

import math

import numpy as np
import pytest
from flax import nnx
from study_config import config_module

import decodelab as dl
from decodelab import experiment, report, serving
from decodelab.measure import compiles, paged_roofline, replays
from decodelab.report import paged as paged_report

PROGRAMS = ("prefill_rows", "_advance_loop", "advance_rows", "harvest")
TINY = {"model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2, "model.n_kv_heads": 2,
        "model.d_ff": 64, "model.max_seq_len": 128, "vocab_size": 256, "memory_tokens": 256,
        "page_size": 8, "paged_slots": 16, "replays": 2, "trace.num_requests": 12,
        "step_calls": 3, "max_len": 64}


@pytest.fixture(scope="module")
def study():
    from experiments import paged

    return paged


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


def test_each_arm_runs_its_policy_on_its_memory(study):
    config = experiment.apply_overrides(config_module("paged").get_config(), TINY)
    config.arm = "static"
    assert study.arm(config) == replays.Arm("static", 4, 64, 2)
    config.arm = "paged"
    assert study.arm(config) == replays.Arm("continuous", 16, 64, 2, kv_tokens=256, page_size=8)
    config.arm = "beam"
    with pytest.raises(ValueError, match="arm must be one of"):
        study.evaluate(config, None)


def test_after_the_warm_up_a_paged_replay_with_preemptions_compiles_nothing(study, tiny_config):
    module = config_module("paged")
    config = experiment.apply_overrides(module.get_config(), {
        **TINY, "arm": "paged", "max_len": 64, "memory_tokens": 128, "trace.rate": 1000.0})
    model = dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))
    trace = study.make_trace(config, 0)
    arm = study.arm(config)
    replays.warm_up(model, arm, trace)
    with compiles.count_traces() as counts:
        result = serving.replay(arm.engine(model), trace, serving.Continuous(),
                                clock=serving.VirtualClock(1.0), steps_per_call=2)
    assert result.summary["preemptions"] > 0 and result.summary["completed"] == 12
    assert {name: counts[name] for name in PROGRAMS} == dict.fromkeys(PROGRAMS, 0)


@pytest.fixture(scope="module")
def rows(study, tmp_path_factory):
    """Real tiny points of every arm, run by the runner (which checks the metrics it stores)."""
    config = experiment.apply_overrides(config_module("paged").get_config(), TINY)
    points = [{"arm": arm, "trace.rate": 200.0} for arm in ("static", "continuous", "paged")]
    points += [{"arm": "step", "step_batch": b} for b in (2, 16)]
    return experiment.run(config, points, study.evaluate, tmp_path_factory.mktemp("paged"),
                          progress=False)


def test_the_arms_rows(rows):
    static, continuous, paged, small, big = (r["metrics"] for r in rows)
    assert static["slots"] == continuous["slots"] == 4 and paged["slots"] == 16
    for m in (static, continuous, paged):
        assert m["completed"] == 12 and len(m["replay_output_tokens_per_s"]) == 2
        assert m["per_request_tokens"] == static["per_request_tokens"]  # the same requests
    assert paged["mean_running"] > continuous["mean_running"]
    assert small["batch"] == 2 and big["batch"] == 16 and len(big["step_s_all"]) == 3


def test_the_page_renders_from_the_rows(study, rows, tmp_path):
    done = report.render(study.forms(rows)[0], rows, tmp_path)
    page = done.page.read_text()
    assert page.startswith("# Do continuous batching's published gains come from scheduling or "
                           "paged memory?\n\nAt reservation ratio ")
    assert ("| max_len | reservation ratio | scheduling (b / a) | memory (c / b) | paged / static "
            "(c / a) | running requests (c / b) | step cost (c / b) |") in page
    assert "\n| 64 | " in page
    assert sorted(p.name for p in done.written) == [
        "paged.csv", "paged.md", "paged.png", "paged_decomposition.csv", "paged_intervals.csv",
        "paged_points.csv", "paged_published.csv", "paged_steps.csv"]
    assert (tmp_path / "paged_published.csv").read_text().splitlines()[0].endswith(
        '"paged batch, pool 96% full","memory, full pool","predicted total, full pool"')


def test_the_memory_factor_is_read_against_what_rounds_of_each_batch_cost(study, rows, tmp_path):
    """The reading caps each arm's tokens/s by its rounds alone: (b) decodes all its padded
    slots, (c) its occupied slots rounded up to a power of two; seconds per round interpolated
    between the `step` points."""
    _, continuous, paged, small, big = (r["metrics"] for r in rows)
    report.render(study.forms(rows)[0], rows, tmp_path)
    text = (tmp_path / "paged.md").read_text()
    steps = {2: small["step_s"], 16: big["step_s"]}

    def round_s(batch):
        return float(np.interp(batch, sorted(steps), [steps[b] for b in sorted(steps)]))

    bucket = 1 << (math.ceil(paged["mean_running"]) - 1).bit_length()
    cap_b = continuous["mean_running"] / round_s(continuous["slots"])
    cap_c = paged["mean_running"] / round_s(bucket)
    n = report.format_value
    assert (f"the rounds alone cap (b) at {n(cap_b)} and (c) at {n(cap_c)} output tokens/s "
            f"({n(cap_c / cap_b)}x)") in text
    assert f"({bucket} rows at its mean of {n(paged['mean_running'])} running" in text
    assert f"ran {n(paged['page_occupancy'])} full over a trace" in text


# --- The page from synthetic rows: known ratios at every max_len ---------------------------------

RUNNING = {"static": 2.0, "continuous": 4.0, "paged": 16.0}  # mean running requests
SPEED = {"static": 500.0, "continuous": 1000.0, "paged": 1100.0}  # output tokens/s at saturation
NOISE = (1.0, 0.98, 1.02)  # each replay's value over replay 0's


def _synthetic() -> list[dict]:
    module = config_module("paged")
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    out = []
    for p in experiment.expand(module.get_config(), module.get_sweep()):
        c = p.config
        if c.arm == "step":
            metrics = {"step_s": 0.001 * (1 + c.step_batch / 4), "step_s_all": [0.001] * 3,
                       "batch": c.step_batch}
        else:
            load = 1.0 if c.trace.rate == 64 else 0.5
            speed, running = load * SPEED[c.arm], load * RUNNING[c.arm]
            metrics = {"output_tokens_per_s": speed, "mean_running": running, "preemptions": 0,
                       "slots": 16 if c.arm == "paged" else c.memory_tokens // c.max_len,
                       "mean_request_len": 37.5, "reservation_ratio": c.max_len / 37.5,
                       "page_occupancy": 0.3169 if c.arm == "paged" else None,
                       "replay_output_tokens_per_s": [speed * f for f in NOISE],
                       "replay_mean_running": [running * f for f in NOISE]}
        out.append(dict(experiment="paged", config_hash=p.config_hash, seed=0,
                        sweep_index=p.index, overrides=p.overrides, config=c.to_dict(),
                        metrics=metrics, start_time="2026-01-01T00:00:00+00:00",
                        wall_time_s=1.0, provenance=provenance))
    return out


def test_the_claims_are_judged_at_the_ratios_nearest_8_and_16(study):
    rows = _synthetic()
    judged = [claim.judge(rows) for claim in study.CLAIMS]
    assert paged_report.nearest(rows, 8.0).max_len == 336
    assert paged_report.nearest(rows, 16.0).max_len == 672
    running, memory, total, roofline = judged
    assert running.measured.value == pytest.approx(4.0) and running.verdict.text == "met"
    assert memory.measured.value == pytest.approx(1.1) and memory.verdict.text == "not met"
    assert total.measured.value == pytest.approx(2.2) and total.verdict.text == "not met"
    # Scheduling times memory, by the roofline at the published shapes, with the pool 96% full.
    assert roofline.measured == pytest.approx(7.2, abs=0.05)
    assert roofline.verdict.text == "not met (point estimate, no interval)"


def test_the_published_prediction_keeps_the_pages_numbers(study, tmp_path):
    # The occupancy the committed page measured (0.3169 at max_len 96) gives its table.
    rows = _synthetic()
    table = paged_report.predictions_table(rows)
    cells = [[report.format_value(v) for v in line] for line in table.rows]
    assert cells == [
        ["128", "3.20", "0.317", "7", "8.26", "2.60", "1.16", "3.00", "25.0", "2.76", "7.18"],
        ["256", "2.67", "0.317", "7", "7.43", "2.59", "1.05", "2.73", "22.5", "2.52", "6.52"],
        ["512", "2.00", "0.317", "7", "6.20", "2.39", "0.900", "2.16", "18.8", "2.15", "5.15"]]
    page = report.render(study.forms(rows)[0], rows, tmp_path).page.read_text()
    assert "| 336 | 8.96 | 2.00 [2.00, 2.00] | 1.10 [1.10, 1.10] | 2.20 [2.20, 2.20] |" in page
    assert ("roofline: scheduling x memory at the published benchmark's shapes | 7.18x | >= 23.0x "
            "| not met (point estimate, no interval) |") in page


def test_the_roofline_prediction_against_a_hand_computed_case():
    # 1 GB of weights, KV 1 MB per token, 3 GB of KV memory (3000 tokens), 1000 GB/s; requests of
    # a 100-token prompt reserving 1000 tokens: 3 padded slots. Mean output 400: a request holds
    # 100 + 200 = 300 tokens on average, so at occupancy 0.9 the pool runs 9 requests.
    benchmark = paged_roofline.Benchmark(
        gain=23.0, params=0.5e9, bytes_per_value=2, n_layers=1, d_model=250_000,
        gpu_memory_gb=5.0, workspace_gb=1.0, prompt=100, output_cap=900, bandwidth_gbs=1000.0,
        mean_output=400.0)
    pred = paged_roofline.roofline_prediction(benchmark, 400.0, 0.9)
    assert pred["kv_tokens"] == pytest.approx(3000) and pred["padded_batch"] == 3
    assert pred["paged_batch"] == pytest.approx(9.0)
    step = lambda b: (1e9 + b * 300 * 1e6) / 1e12  # noqa: E731
    assert pred["memory"] == pytest.approx((9 / step(9)) / (3 / step(3)))
    assert pred["product"] == pytest.approx(pred["scheduling"] * pred["memory"])
    assert pred["ratio"] == pytest.approx(2.0)


def test_static_waste_against_known_cases():
    # A batch of one wastes nothing; outputs nearly all at a cap far below the mean waste
    # almost nothing.
    waste = paged_roofline.static_waste
    assert waste(50.0, 1000, 1) == pytest.approx(1.0)
    assert waste(1e6, 10, 8) == pytest.approx(1.0, rel=1e-4)  # a rare draw < 10
    # Uncapped exponential: E[max of n] / E[X] = H_n, the n-th harmonic number.
    assert waste(1000.0, 10**9, 4) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4, rel=0.02)
    assert np.isfinite(waste(256.0, 1536, 7))
