"""The batching study's pieces: its long-prompt trace, its warm-up (after which a timed replay
compiles none of the engine's programs), the per-request and per-replay values its rows keep,
and its page in the one form: intervals over requests and over replays and claims judged by them,
from synthetic rows (no model)."""

import csv
import re
import types

import numpy as np
import pytest
from flax import nnx
from study_config import config_module

import decodelab as dl
from decodelab import experiment, report, serving
from decodelab.measure import compiles, replays, stats
from decodelab.report import serving_rows

PROGRAMS = ("prefill_rows", "_advance_loop", "harvest")


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
    arm = replays.Arm("continuous", num_slots=2, max_len=64, steps_per_call=2,
                      prefill_chunk=chunk)
    trace = serving.poisson_trace(
        8, 50.0, {"kind": "uniform", "low": 4, "high": 40},
        {"kind": "fixed", "length": 3}, vocab_size=512, seed=0,
        params=dl.SamplingParams(temperature=0.8, top_p=0.95))
    assert max(len(r.prompt) for r in trace) > 32  # three prompt blocks: 16, 32 and 64
    replays.warm_up(tiny, arm, trace)
    with compiles.count_traces() as counts:
        result = serving.replay(arm.engine(tiny), trace, serving.Continuous(),
                                clock=serving.VirtualClock(1.0), steps_per_call=2)
    assert {name: counts[name] for name in PROGRAMS} == dict.fromkeys(PROGRAMS, 0)
    values = serving.per_request(result.records)
    assert values["tokens"] == [3] * 8
    assert [len(v) for v in values.values()] == [8] * 5


def test_a_point_runs_its_policy_on_its_engine():
    from experiments import batching

    config = config_module("batching").get_config("tiny")
    config.update(policy="dynamic", dynamic_max_wait=0.5)
    config.engine.update(prefill_chunk=16)
    arm = batching.arm(config)
    assert arm == replays.Arm("dynamic", 8, 128, 2, 16, max_wait=0.5)
    assert arm.scheduler() == serving.Dynamic(8, 0.5)


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

    report.render(batching.forms(rows)[0], rows, tmp_path)
    return (tmp_path / "batching.md").read_text()


def _line(page: str, start: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(start))


def _verdict(page: str, claim: str) -> list[str]:
    """The verdict table's cells of ``claim``: measured [interval], threshold, verdict."""
    line = _line(page, f"| {claim} |")
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")[1:]]


STATIC_LONG = ("static", "long_tail", 64.0, 0)


def test_throughput_is_the_mean_over_replays_and_the_percentiles_the_rows_of_replay_0():
    m = _metrics(_records())
    replayed = m["replay_output_tokens_per_s"]
    assert serving_rows.shown(m, "output_tokens_per_s") == stats.bootstrap(stats.mean, replayed)
    assert serving_rows.shown(m, "output_tokens_per_s").value == pytest.approx(
        m["output_tokens_per_s"] * np.mean(FACTORS), rel=1e-12)
    assert serving_rows.shown(m, "output_tokens_per_s").units == 5
    for metric in ("latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s"):
        assert serving_rows.shown(m, metric).value == m[metric]
        assert serving_rows.shown(m, metric).units == 64


def test_the_page_follows_the_form(tmp_path):
    rows = _rows()
    page = _page(rows, tmp_path)
    lines = page.splitlines()
    assert lines[0] == "# What do continuous batching and chunked prefill buy over static batching?"
    assert lines[2].startswith("At saturation continuous batching gives 1.00x [1.00, 1.00] static "
                               "batching's output tokens/s on long-tailed outputs (>= 2.2x: not "
                               "met)")
    assert lines[2].endswith(": 0 of 12 claims met, 1 not met, 11 undecided or not measured.")
    header = _line(page, "| point")
    assert header.count(" | ") + 1 <= 7
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "batching.csv", "batching.md", "batching.png", "batching_intervals.csv",
        "batching_points.csv"]
    assert not re.search(r"\d[eE][+-]?\d", page)  # plain notation, never 1.03e+04
    # Every metric of a row (the per-request and per-replay lists aside) is in some CSV.
    with open(tmp_path / "batching_points.csv") as f:
        columns = set(next(csv.reader(f)))
    assert {name for name, v in rows[0]["metrics"].items() if not isinstance(v, list)} <= columns


def test_the_tables_show_intervals_over_requests_and_the_csv_their_bounds(tmp_path):
    page = _page(_rows(), tmp_path)
    cell = r"\d[\d.,]* \[\d[\d.,]*, \d[\d.,]*\]"
    assert re.fullmatch(rf"\| long_tail outputs, continuous \| ({cell} \| ){{5}}0\.500 \|",
                        _line(page, "| long_tail outputs, continuous"))
    assert "| long prompts, chunks of 16 |" in page and "| long prompts, whole prefill |" in page
    with open(tmp_path / "batching_intervals.csv") as f:
        header = next(csv.reader(f))
    assert header[:7] == ["trace.output", "trace.rate", "policy", "trace.prompts",
                          "model.max_seq_len", "engine.max_len", "engine.prefill_chunk"]
    for metric in ("output_tokens_per_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s",
                   "ttft_p99_s", "tpot_p50_s", "max_tbt_p99_s"):
        at = header.index(metric)
        assert header[at + 1:at + 3] == [f"{metric}_low", f"{metric}_high"]
    assert "tbt_p99_s" in header and "slot_occupancy" in header


def test_a_clearly_met_target_renders_met(tmp_path):
    # Static takes 2.5x as long for everything on the same burst: every request sooner, and
    # replay by replay continuous gives 2.45x to 2.53x static's throughput.
    static = (_records(scale=2.5), (1.0, 0.99, 1.01, 1.0, 1.03))
    page = _page(_rows({STATIC_LONG: static}), tmp_path)
    assert _verdict(page, "long-tailed outputs: continuous / static output tokens/s") == [
        "2.50x [2.47, 2.52]", ">= 2.20x", "met"]
    for q in ("p50", "p99"):
        measured, threshold, verdict = _verdict(
            page, f"long-tailed outputs: continuous - static {q} latency")
        assert re.fullmatch(r"-\d\.\d+ s \[-\d\.\d+, -\d\.\d+\]", measured)
        assert (threshold, verdict) == ("<= 0 s", "met")
    assert "static batching's output tokens/s on long-tailed outputs (>= 2.2x: met)" in page


def test_a_throughput_ratio_whose_replays_straddle_the_target_is_undecided(tmp_path):
    # Replay by replay continuous gives 1.92x to 3.00x static's throughput.
    static = (_records(scale=2.5), (1.0, 1.26, 0.85, 1.2, 0.89))
    page = _page(_rows({STATIC_LONG: static}), tmp_path)
    ratio = stats.bootstrap_ratio(stats.mean, list(FACTORS), list(static[1]), paired=True)
    assert ratio.low < 2.2 / 2.5 < ratio.high  # the interval of the ratio (over 2.5) holds 2.2
    measured, _, verdict = _verdict(page, "long-tailed outputs: continuous / static output "
                                          "tokens/s")
    assert re.fullmatch(r"2\.\d\dx \[\d\.\d\d, \d\.\d\d\]", measured)
    assert re.fullmatch(r"undecided \(about [\d,]+ replays would be needed\)", verdict)


def test_a_constant_latency_shift_is_detected_by_the_paired_difference(tmp_path):
    # Every request finishes 0.1 s later under static: request by request the difference is
    # exactly -0.1, though the requests' latencies spread far wider.
    page = _page(_rows({STATIC_LONG: _records(shift=0.1)}), tmp_path)
    for q in ("p50", "p99"):
        assert _verdict(page, f"long-tailed outputs: continuous - static {q} latency") == [
            "-0.100 s [-0.100, -0.100]", "<= 0 s", "met"]
    # The throughput ratio (every replay's makespan 0.1 s longer) is far below the 2.2x target.
    assert _verdict(page, "long-tailed outputs: continuous / static output tokens/s")[2] == (
        "not met")


def test_noise_is_not_distinguishable_at_this_sample_size(tmp_path):
    # Each request finishes earlier or later under static by zero-mean noise (sd 0.05 s).
    noise = np.random.default_rng(0).normal(0.0, 0.05, size=len(TOKENS))
    page = _page(_rows({STATIC_LONG: _records(noise=noise - noise.mean())}), tmp_path)
    measured, _, verdict = _verdict(page, "long-tailed outputs: continuous - static p50 latency")
    assert re.fullmatch(r"-?\d\.\d+ s \[-\d\.\d+, \d\.\d+\]", measured)
    assert re.fullmatch(r"undecided \(about [\d,]+ requests would be needed\)", verdict)


def test_chunked_prefill_that_lowers_ttft_by_a_constant_meets_its_target(tmp_path):
    # Chunks of 16 bring every request's first token (and every later one) 0.05 s sooner; the
    # gaps between tokens do not change.
    page = _page(_rows({("continuous", "long_tail", 64.0, 16): _records(shift=-0.05)}), tmp_path)
    words = "long prompts, chunks of 16: chunked"
    assert _verdict(page, f"{words} - whole p99 TTFT") == ["-0.0500 s [-0.0500, -0.0500]",
                                                         "<= 0 s", "met"]
    assert _verdict(page, f"{words} - whole p99 longest gap between tokens")[2].startswith(
        "undecided")
    # Every replay's makespan 0.05 s shorter: 1.06x the throughput, replay by replay.
    assert _verdict(page, f"{words} / whole output tokens/s") == ["1.06x [1.06, 1.06]",
                                                                ">= 1.00x", "met"]
    assert "chunked prefill lowers 1 of the 4 p99 TTFT and longest-gap tails" in page


def test_rows_of_different_requests_are_not_paired(tmp_path):
    # One request fewer tokens under static: request i is no longer the same request, so the
    # difference is the plain one, judged as a point estimate.
    records = _records()
    records[0].tokens = records[0].tokens[:-1]
    page = _page(_rows({STATIC_LONG: records}), tmp_path)
    measured, _, verdict = _verdict(page, "long-tailed outputs: continuous - static p50 latency")
    assert "[" not in measured and verdict.endswith("(point estimate, no interval)")


def test_rows_without_per_request_or_per_replay_values_still_render_plain(tmp_path):
    rows = _rows({STATIC_LONG: _records(scale=2.5)})
    for row in rows:
        for name in [k for k in row["metrics"] if k.startswith(("per_request_", "replay"))]:
            del row["metrics"][name]
    page = _page(rows, tmp_path)
    assert "[" not in _line(page, "| long_tail outputs, static")
    assert _verdict(page, "long-tailed outputs: continuous / static output tokens/s") == [
        "2.50x", ">= 2.20x", "met (point estimate, no interval)"]
    assert _verdict(page, "long-tailed outputs: continuous - static p99 latency") == [
        "-1.37 s", "<= 0 s", "met (point estimate, no interval)"]
    assert "Output tokens/s and mean running requests: the one replay" in page


def test_rows_of_a_single_replay_show_throughput_plain(tmp_path):
    page = _page(_rows({STATIC_LONG: (_records(scale=2.5), (1.0,))}), tmp_path)
    assert _verdict(page, "long-tailed outputs: continuous / static output tokens/s") == [
        "2.51x", ">= 2.20x", "met (point estimate, no interval)"]
    assert "the mean of 1 to 5 replays" in page
