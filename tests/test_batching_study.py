"""The batching study's pieces: its long-prompt trace, its warm-up (after which a timed replay
compiles none of the engine's programs), the per-request and per-replay values its rows keep,
and its page: intervals over requests and over replays and claims judged by them, from synthetic
rows (no model)."""

import csv
import re
import types

import numpy as np
import pytest
from flax import nnx
from ml_collections import config_dict
from study_config import config_module

import decodelab as dl
from decodelab import experiment, serving
from decodelab.measure import compiles, stats

PROGRAMS = ("prefill_rows", "_advance_loop", "harvest", "replan")


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


def test_each_replay_draws_its_own_trace_and_replay_0_is_the_single_replay_point():
    from experiments import batching

    config = config_module("batching").get_config("tiny")
    config.vocab_size = 512
    config.engine.update(num_slots=2, max_len=32)
    config.trace.update(num_requests=4, rate=50.0, output="long_tail")
    config.trace.output_long_tail.update(median=4.0, cap=8)
    ctx = types.SimpleNamespace(status=lambda text: None, show_progress=False)
    config.replays = 2
    two = batching.evaluate(config, ctx)
    config.replays = 1
    one = batching.evaluate(config, ctx)
    budgets = [[r.max_new_tokens for r in batching.make_trace(config, seed)] for seed in (0, 1)]
    assert budgets[0] != budgets[1]  # replay 1 replays another trace
    assert two["per_request_tokens"] == one["per_request_tokens"] == budgets[0]
    assert two["replays"] == 2 and one["replays"] == 1
    for name in batching.REPLAYED:
        assert len(two[f"replay_{name}"]) == 2 and len(one[f"replay_{name}"]) == 1
        assert two[f"replay_{name}"][0] == two[name]
    assert two["replay_makespan_s"][1] != two["replay_makespan_s"][0]
    with pytest.raises(ValueError, match="replays must be an int >= 1, got 0"):
        config.replays = 0
        batching.evaluate(config, ctx)


# --- The page, from synthetic rows ---------------------------------------------------------------

TOKENS = [2 + (7 * i) % 23 for i in range(64)]  # output lengths 2..24, in trace order


def _records(scale: float = 1.0, shift: float = 0.0, noise=None) -> list[serving.RequestRecord]:
    """A replay of a burst of 64 requests, all arriving at 0: request i's first delivery at
    0.1 + 0.01 i, then one every 0.02 s, 2 tokens each. Every delivery time is multiplied by
    ``scale`` and moved by ``shift`` (plus ``noise[i]`` for request i)."""
    records = []
    for i, k in enumerate(TOKENS):
        moved = shift + (0.0 if noise is None else noise[i])
        times = [scale * (0.1 + 0.01 * i + 0.02 * j) + moved for j in range((k + 1) // 2)]
        records.append(serving.RequestRecord(
            request_id=i, arrival=0.0, status="completed", admitted=times[0] / 2,
            first_token=times[0], finish=times[-1], tokens=[0] * k, deliveries=times))
    return records


FACTORS = (1.0, 0.97, 1.02, 0.99, 1.04)  # each replay's throughput over replay 0's


def _metrics(records: list[serving.RequestRecord], factors=FACTORS) -> dict:
    """A row's metrics as ``evaluate`` writes them: replay 0 is the replay of ``records`` (the
    summary and the per-request lists); replay r's throughput is ``factors[r]`` times replay
    0's, its latencies and makespan divided by it."""
    busy = 4 * max(r.finish for r in records)  # half of the 8 slots busy over the makespan
    summary = serving.summarize(records, 8, busy)
    replayed = {f"replay_{name}": [summary[name] / f for f in factors]
                for name in ("latency_p50_s", "latency_p99_s", "ttft_p99_s", "makespan_s")}
    return {**summary, "engine_calls": 100, "mean_prompt_len": 10.0,
            "max_prompt_len": 16, "mean_output_len": float(np.mean(TOKENS)),
            "max_output_len": max(TOKENS), "static_waste_factor": 2.3, "replay_wall_s": 1.0,
            "idle_skipped_s": 0.0, "warmup_s": 1.0, "load_avg_1m_before": 1.0,
            "load_avg_1m_after": 1.0,
            **{f"per_request_{name}": values
               for name, values in serving.per_request(records).items()},
            "replays": len(factors),
            "replay_output_tokens_per_s": [summary["output_tokens_per_s"] * f for f in factors],
            **replayed, "replay_static_waste_factor": [2.3] * len(factors)}


def _rows(changed: dict | None = None) -> list[dict]:
    """Every point of the study's sweep with the metrics of ``_records()``; ``changed`` maps
    (policy, output, rate, prefill chunk) to other records, or to (records, factors). Long-prompt
    points have output "long_tail"."""
    module = config_module("batching")
    points = experiment.expand(module.get_config(), module.get_sweep())
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    rows = []
    for p in points:
        c = p.config
        at = (c.policy, c.trace.output, c.trace.rate, c.engine.prefill_chunk)
        given = (changed or {}).get(at) or _records()
        records, factors = given if isinstance(given, tuple) else (given, FACTORS)
        rows.append(dict(experiment="batching", config_hash=p.config_hash, seed=0,
                         sweep_index=p.index, overrides=p.overrides, config=c.to_dict(),
                         metrics=_metrics(records, factors), start_time="2026-01-01T00:00:00+00:00",
                         wall_time_s=1.0, provenance=provenance))
    return rows


def _page(rows, tmp_path) -> str:
    from experiments import batching

    batching.report(rows, tmp_path)
    return (tmp_path / "batching.md").read_text()


def _line(page: str, start: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(start))


STATIC_LONG = ("static", "long_tail", 64.0, 0)


def test_throughput_is_the_mean_over_replays_and_the_percentiles_the_rows_of_replay_0():
    from experiments import batching

    m = _metrics(_records())
    replays = m["replay_output_tokens_per_s"]
    assert batching.interval(m, "output_tokens_per_s") == stats.bootstrap(stats.mean, replays)
    assert batching.interval(m, "output_tokens_per_s").value == pytest.approx(
        m["output_tokens_per_s"] * np.mean(FACTORS), rel=1e-12)
    assert batching.interval(m, "output_tokens_per_s").units == 5
    for metric in ("latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s"):
        assert batching.interval(m, metric).value == m[metric]
        assert batching.interval(m, metric).units == 64


def test_the_tables_show_intervals_over_requests_and_the_csv_their_bounds(tmp_path):
    page = _page(_rows(), tmp_path)
    p50 = page[page.index("**long_tail: p50 end-to-end latency (s)**"):]
    cell = r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]"
    assert re.fullmatch(rf"\| continuous \| {cell} \| {cell} \| {cell} \| {cell} \|",
                        _line(p50, "| continuous |"))
    tput = page[page.index("**long_tail: output tokens/s (mean of 5 replays)**"):]
    assert re.fullmatch(r"\| static \| (\d+ \[\d+, \d+\] \| ){4}", _line(tput, "| static |") + " ")
    assert ("Brackets on latency, TTFT, TPOT and the longest gap: 95% percentile bootstrap "
            "interval over the completed requests of the point's replay 0") in page
    assert ("Brackets on output tokens/s: the mean of 5 replays of the point (replay r replays "
            "the trace drawn with seed + r") in page
    with open(tmp_path / "batching_long_tail_latency_p50_s.csv") as f:
        assert next(csv.reader(f)) == ["policy \\ trace.rate", "2", "2_low", "2_high", "6", "6_low",
                                       "6_high", "16", "16_low", "16_high", "64", "64_low",
                                       "64_high"]


def test_a_clearly_met_target_renders_met(tmp_path):
    # Static takes 2.5x as long for everything on the same burst: every request sooner, and
    # replay by replay continuous gives 2.45x to 2.53x static's throughput.
    static = (_records(scale=2.5), (1.0, 0.99, 1.01, 1.0, 1.03))
    page = _page(_rows({STATIC_LONG: static}), tmp_path)
    target = _line(page, "Target (long-tailed trace at saturation")
    assert ("lower p50 and p99 latency): **met** (throughput ratio 2.50x [2.47, 2.52] against "
            "2.2: met; p50 latency -") in target
    assert re.search(r"p50 latency -\d\.\d\d \[-\d\.\d\d, -\d\.\d\d\] s: lower; p99 latency "
                     r"-\d\.\d\d \[-\d\.\d\d, -\d\.\d\d\] s: lower\)\.", target)
    assert "The throughput verdict rests on 5 replays" in target
    assert "= **2.50x [2.47, 2.52]** (continuous higher)" in _line(page, "- **long_tail**")


def test_a_throughput_ratio_whose_replays_straddle_the_target_is_not_distinguishable(tmp_path):
    # Replay by replay continuous gives 1.92x to 3.00x static's throughput.
    static = (_records(scale=2.5), (1.0, 1.26, 0.85, 1.2, 0.89))
    page = _page(_rows({STATIC_LONG: static}), tmp_path)
    target = _line(page, "Target (long-tailed trace at saturation")
    ratio = stats.bootstrap_ratio(stats.mean, list(FACTORS), list(static[1]), paired=True)
    assert ratio.low < 2.2 / 2.5 < ratio.high  # the interval of the ratio (over 2.5) holds 2.2
    assert re.search(r"\*\*not distinguishable at this sample size\*\* \(throughput ratio "
                     r"2\.\d\dx \[\d\.\d\d, \d\.\d\d\] against 2\.2: not distinguishable at "
                     r"this sample size \(about [\d,]+ replays would be needed\); p50 latency -",
                     target)


def test_a_constant_latency_shift_is_detected_by_the_paired_difference(tmp_path):
    # Every request finishes 0.1 s later under static: request by request the difference is
    # exactly -0.1, though the requests' latencies spread far wider.
    page = _page(_rows({STATIC_LONG: _records(shift=0.1)}), tmp_path)
    line = _line(page, "- **long_tail**")
    assert "(paired difference -0.10 [-0.10, -0.10] s: lower)" in line
    assert "(-0.10 [-0.10, -0.10] s: lower)" in line  # p99
    # The throughput ratio (every replay's makespan 0.1 s longer) is far below the 2.2x target.
    assert "2.2x static output tokens/s with lower p50 and p99 latency): **not met**" in page


def test_noise_is_not_distinguishable_at_this_sample_size(tmp_path):
    # Each request finishes earlier or later under static by zero-mean noise (sd 0.05 s).
    noise = np.random.default_rng(0).normal(0.0, 0.05, size=len(TOKENS))
    page = _page(_rows({STATIC_LONG: _records(noise=noise - noise.mean())}), tmp_path)
    line = _line(page, "- **long_tail**")
    assert re.search(r"\(paired difference [-+]\d\.\d\d \[-\d\.\d\d, \+\d\.\d\d\] s: not "
                     r"distinguishable at this sample size \(about [\d,]+ requests would be "
                     r"needed\)\)", line)


def test_chunked_prefill_that_lowers_ttft_by_a_constant_meets_its_target(tmp_path):
    # Chunks of 16 bring every request's first token (and every later one) 0.05 s sooner; the
    # gaps between tokens do not change.
    page = _page(_rows({("continuous", "long_tail", 64.0, 16): _records(shift=-0.05)}), tmp_path)
    line = _line(page, "- chunks of 16:")
    assert "(paired difference -0.050 [-0.050, -0.050] s: lower)" in line
    assert "(+0.0 [+0.0, +0.0] ms: not distinguishable at this sample size (" in line
    # Every replay's makespan 0.05 s shorter: 1.06x the throughput, replay by replay.
    assert "tokens/s (mean of 5 replays) = 1.06x [1.06, 1.06] (chunked higher)." in line
    assert ("trace): **met** (chunks of 16: p99 TTFT); 4 comparisons, each at 95%") in page


def test_rows_of_different_requests_are_not_paired(tmp_path):
    # One request fewer tokens under static: request i is no longer the same request.
    records = _records()
    records[0].tokens = records[0].tokens[:-1]
    page = _page(_rows({STATIC_LONG: records}), tmp_path)
    assert ("(paired difference not judged (the two rows do not hold the same completed "
            "requests));") in _line(page, "- **long_tail**")


def test_rows_without_per_request_or_per_replay_values_still_render_plain_and_not_judged(
        tmp_path):
    rows = _rows({STATIC_LONG: _records(scale=2.5)})
    for row in rows:
        for name in [k for k in row["metrics"] if k.startswith(("per_request_", "replay"))]:
            del row["metrics"][name]
    page = _page(rows, tmp_path)
    assert "No intervals over requests: some rows keep no per-request values" in page
    assert ("No intervals on output tokens/s for some points (the rows keep no per-replay "
            "throughputs (written by an earlier version of the study)): they show the plain "
            "number") in page
    assert all("[" not in line for line in page.splitlines() if line.startswith("| "))
    assert "**long_tail: output tokens/s (one replay)**" in page
    assert ("(paired difference not judged (no per-request values in the rows)); p99 latency "
            "0.91 s vs 2.28 s (not judged (no per-request values in the rows));") in page
    assert ("lower p50 and p99 latency): **not judged (the rows keep no per-replay throughputs "
            "(written by an earlier version of the study))** (throughput ratio 2.50x against "
            "2.2: not judged (the rows keep no per-replay throughputs (written by an earlier "
            "version of the study)); p50 latency not judged") in page
    assert "trace): **not judged (no per-request values in the rows)**" in page


def test_rows_of_a_single_replay_show_throughput_plain_and_not_judged(tmp_path):
    page = _page(_rows({STATIC_LONG: (_records(scale=2.5), (1.0,))}), tmp_path)
    assert ("No intervals on output tokens/s for some points (a single replay per point; an "
            "interval over replays needs at least 2)") in page
    assert ("= **2.51x** (not judged (a single replay per point; an interval over replays "
            "needs at least 2)); p50 latency") in _line(page, "- **long_tail**")
    assert "**long_tail: output tokens/s (mean of each point's replays (1 to 5))**" in page
