"""Static, dynamic and continuous batching: throughput and latency of one slot engine replaying the
same request traces under each policy.

    python -m experiments.batching --config=configs/batching.py --workdir=runs/batching
    python -m experiments.report --workdir=runs/batching --out=results

What a point measures (decodelab/serving/metrics.py has the exact conventions): seeded Poisson
traces are replayed through a ``SlotEngine`` under one policy on a wall clock: prefill, decode
steps and host work take their real time, and idle gaps (engine empty, next arrival in the
future) are skipped instead of slept (``WallClock(skip_idle=True)``), which changes no measured
duration. A point makes ``config.replays`` replays: replay r replays the trace drawn with trace
seed ``config.seed + r`` (the model's random weights keep ``config.seed``), so replay r of every
policy replays the same trace, and each replay runs on a fresh engine. Before timing each replay,
a warm-up compiles every program its trace can need (each prefill shape: number of prompts and
prompt block, see ``warm_up``); compiled programs are cached, so later warm-ups are cheap.

A row holds replay 0's summary (``serving.summarize``: throughput, latency, TTFT, TPOT and
time-between-tokens percentiles, occupancy), its engine calls, its trace's prompt and output
lengths and ideal static waste (``static_waste_factor``), its timed wall time
(``replay_wall_s``) and skipped idle time (``idle_skipped_s``), and every completed request's
latency, TTFT, TPOT, longest time between tokens and output length in replay 0
(``per_request_*`` lists, trace order), so intervals can be bootstrapped over requests. Over all
replays:

- ``replays``: how many replays the point made;
- ``replay_output_tokens_per_s``, ``replay_latency_p50_s``, ``replay_latency_p99_s``,
  ``replay_ttft_p99_s``, ``replay_makespan_s``, ``replay_static_waste_factor``: each replay's
  value, in replay order (element 0 is replay 0's, the summary's value);
- ``warmup_s``: the seconds of every replay's warm-up together;
- ``load_avg_1m_before`` / ``load_avg_1m_after``: the 1-minute load average before replay 0's
  timed replay and after the last replay.

The page (``report``) shows 95% bootstrap intervals and judges its claims by them
(``results.verdict``). Output tokens/s, one number of a whole replay, is the mean over the
replays with an interval over replays; the ratio of two points of the same traces (continuous
over static, chunked over whole prefill) is paired replay by replay. Latency, TTFT and TPOT
percentiles are replay 0's, with intervals over its requests; two points are compared request by
request, a paired bootstrap. Rows without the per-request or per-replay lists (older runs, or a
single replay) show plain numbers, not judged.

The model has random weights. Speed does not depend on the weights' values (the same shapes run
the same operations), and output lengths come from the trace: there is no EOS, each request runs
exactly its budget. A trained model would only change which tokens come out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import time

import numpy as np
from absl import app
from flax import nnx

import decodelab as dl
from decodelab import experiment, serving
from decodelab import report as results
from decodelab.decode.request import bucket_length
from decodelab.experiment import presets
from decodelab.measure import stats

_FLAGS = experiment.define_flags("configs/batching.py")


@functools.lru_cache(maxsize=2)
def random_model(model_json: str, vocab_size: int, seed: int) -> dl.Transformer:
    """The model of section ``model_json`` (JSON, sorted keys: hashable for the cache) with random
    weights drawn from ``seed``; kept across the points of one process."""
    cfg = presets.build_model_config(json.loads(model_json), vocab_size)
    return dl.Transformer(cfg, rngs=nnx.Rngs(seed))


def make_trace(config, seed: int) -> list[serving.Request]:
    """The point's trace drawn with trace seed ``seed`` (replay r: ``config.seed + r``)."""
    t = config.trace
    params = dl.SamplingParams(temperature=t.temperature, top_p=t.top_p)
    return serving.poisson_trace(t.num_requests, t.rate, t[f"prompt_{t.prompts}"].to_dict(),
                                 t[f"output_{t.output}"].to_dict(), vocab_size=config.vocab_size,
                                 seed=seed, params=params, seed_offset=1000)


def _engine(model, e) -> serving.SlotEngine:
    return serving.SlotEngine(model, e.num_slots, e.max_len, prefill_chunk=e.prefill_chunk or None)


def warm_up(model, e, trace: list[serving.Request]) -> None:
    """Compile, before timing, every program a replay of ``trace`` can run: the decode loop, the
    read-back and each prefill shape, i.e. each number of prompts prefilled together (a power of
    two, up to the slots) with each prompt block (a power of two up to the longest prompt, at
    most the chunk), from slot 0 and, with chunks, from later in the row."""
    longest = max(len(r.prompt) for r in trace)
    chunk = e.prefill_chunk or e.max_len
    # block -> the longest chunk that gets it
    blocks = {min(bucket_length(n), chunk): n for n in range(1, min(longest, chunk) + 1)}
    lengths = list(blocks.values())
    if e.prefill_chunk and longest > chunk:  # a later chunk, alone or beside first chunks
        lengths += [chunk + n for n in blocks.values() if chunk + n < e.max_len]
    rows = bucket_length(e.num_slots, minimum=1)  # the largest prefill block's row count
    counts = [min(1 << i, e.num_slots) for i in range(rows.bit_length())]
    engine, params = _engine(model, e), trace[0].params
    for count in counts:
        for length in lengths:
            engine.run([serving.Request(id=i, prompt=[i % 2 + 1] * length, max_new_tokens=1,
                                        params=params, seed=i) for i in range(count)],
                       n=e.steps_per_call)


# The summary values each replay keeps, in replay order (``replay_<name>`` lists of a row).
REPLAYED = ("output_tokens_per_s", "latency_p50_s", "latency_p99_s", "ttft_p99_s", "makespan_s",
            "static_waste_factor")


def _static_waste(outputs: list[int], num_slots: int) -> float:
    """Slot-steps a full static batch spends (each of its rows held until its longest request
    ends) over the slot-steps the requests need: continuous batching's ideal gain at saturation."""
    groups = [outputs[i:i + num_slots] for i in range(0, len(outputs), num_slots)]
    return sum(max(g) * len(g) for g in groups) / sum(outputs)


def evaluate(config, ctx) -> dict:
    if (not isinstance(config.replays, int) or isinstance(config.replays, bool)
            or config.replays < 1):
        raise ValueError(f"replays must be an int >= 1, got {config.replays!r}")
    model = random_model(json.dumps(config.model.to_dict(), sort_keys=True), config.vocab_size,
                   config.seed)
    e = config.engine
    chunked = f", prefill chunk {e.prefill_chunk}" if e.prefill_chunk else ""
    point = (f"{config.policy} @ {config.trace.rate}/s, {config.trace.prompts} prompts, "
             f"{config.trace.output}{chunked}")
    warmup, replays, first = 0.0, [], None
    for index in range(config.replays):
        ctx.status(f"{point}, replay {index + 1}/{config.replays}")
        trace = make_trace(config, config.seed + index)
        started = time.perf_counter()
        warm_up(model, e, trace)
        warmup += time.perf_counter() - started
        if first is None:
            load_before = os.getloadavg()[0]
        scheduler = serving.make_scheduler(config.policy, e.num_slots, config.dynamic_max_wait)
        started = time.perf_counter()
        result = serving.replay(_engine(model, e), trace, scheduler,
                                steps_per_call=e.steps_per_call, progress=ctx.show_progress)
        wall = time.perf_counter() - started
        outputs = [request.max_new_tokens for request in trace]
        replays.append({**result.summary,
                        "static_waste_factor": _static_waste(outputs, e.num_slots)})
        if first is None:
            prompts = [len(request.prompt) for request in trace]
            first = {**result.summary, "engine_calls": result.steps,
                     "mean_prompt_len": sum(prompts) / len(prompts),
                     "max_prompt_len": max(prompts),
                     "mean_output_len": sum(outputs) / len(outputs),
                     "max_output_len": max(outputs),
                     "static_waste_factor": replays[0]["static_waste_factor"],
                     "replay_wall_s": wall, "idle_skipped_s": result.idle_skipped_s,
                     **{f"per_request_{name}": values
                        for name, values in serving.per_request(result.records).items()}}
    return {**first, "warmup_s": warmup, "load_avg_1m_before": load_before,
            "load_avg_1m_after": os.getloadavg()[0], "replays": config.replays,
            **{f"replay_{name}": [summary[name] for summary in replays] for name in REPLAYED}}


# --- Report --------------------------------------------------------------------------------------

NO_REQUESTS = "no per-request values in the rows"
NOT_PAIRED = "the two rows do not hold the same completed requests"
TOO_FEW = "fewer than 2 requests have a value in both rows"
_PER_REQUEST = ("latency_s", "ttft_s", "tpot_s", "max_tbt_s", "tokens")


def percentile(q: float) -> stats.Statistic:
    """The ``q``-th percentile over the last axis (``[..., n] -> [...]``) with NumPy's linear
    interpolation, as the rows' summaries compute it (serving/metrics.py): a ``stats`` statistic,
    so all resamples are taken in one call."""

    def statistic(x: np.ndarray) -> np.ndarray:
        return np.percentile(x, q, axis=-1)

    return statistic


# How each metric resampled over requests is computed from a row's per-request values: metric ->
# (statistic, the per-request columns it takes). ``max_tbt_p99_s`` is the page's own (the rows'
# ``tbt_p99_s`` pools every gap of every request, which the rows do not keep). Output tokens/s is
# resampled over replays instead (``throughput``).
RESAMPLED = {
    "latency_p50_s": (percentile(50), ("latency_s",)),
    "latency_p99_s": (percentile(99), ("latency_s",)),
    "ttft_p50_s": (percentile(50), ("ttft_s",)),
    "ttft_p99_s": (percentile(99), ("ttft_s",)),
    "tpot_p50_s": (percentile(50), ("tpot_s",)),
    "max_tbt_p99_s": (percentile(99), ("max_tbt_s",)),
}


def _units(m) -> dict[str, np.ndarray] | None:
    """The row's per-request values (replay 0's requests), ``[n]`` each in trace order (NaN where
    a request has none: TPOT below 2 tokens, longest gap below 2 deliveries); None for a row
    without them."""
    if any(f"per_request_{name}" not in m for name in _PER_REQUEST):
        return None
    return {name: np.array([np.nan if v is None else v for v in m[f"per_request_{name}"]],
                           np.float64) for name in _PER_REQUEST}


def _kept(columns: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The columns at the requests where every column has a value."""
    keep = np.logical_and.reduce([np.isfinite(c) for c in columns])
    return tuple(c[keep] for c in columns)


def interval(m, metric: str) -> stats.Interval | None:
    """The 95% interval of ``metric``: output tokens/s over the row's replays (``throughput``),
    any other over the completed requests of replay 0; None without the values it resamples or
    with fewer than 2 units that have one."""
    if metric == "output_tokens_per_s":
        return throughput(m)
    units = _units(m)
    if units is None:
        return None
    statistic, names = RESAMPLED[metric]
    try:
        return stats.bootstrap(statistic, _kept([units[name] for name in names]))
    except ValueError:
        return None


def _unpaired(a, b) -> str | None:
    """Why rows ``a`` and ``b`` cannot be compared request by request, or None if they can: both
    keep per-request values, every request completed in both, and the output lengths agree in
    trace order (there is no EOS, so the same request gives the same length under any policy)."""
    if _units(a) is None or _units(b) is None:
        return NO_REQUESTS
    if (a["completed"] != a["requests"] or b["completed"] != b["requests"]
            or a["per_request_tokens"] != b["per_request_tokens"]):
        return NOT_PAIRED
    return None


def paired(a, b, metric: str) -> stats.Interval | None:
    """``metric`` of row ``a`` minus that of row ``b``, paired request by request over replay 0:
    both replay the same trace, so request i is the same request in both. Requests without a
    value in either row are left out. None where ``_unpaired`` gives a reason, or with fewer than
    2 requests left."""
    if _unpaired(a, b):
        return None
    statistic, names = RESAMPLED[metric]
    units_a, units_b = _units(a), _units(b)
    columns = _kept([units_a[name] for name in names] + [units_b[name] for name in names])
    try:
        return stats.bootstrap_difference(statistic, columns[:len(names)], columns[len(names):],
                                          paired=True)
    except ValueError:
        return None


def _judge(a, b, interval_: stats.Interval | None, **kwargs) -> results.Verdict:
    """``results.verdict`` over requests; without an interval it says why."""
    return results.verdict(interval_, units="requests", missing=_unpaired(a, b) or TOO_FEW,
                           **kwargs)


NO_REPLAYS = "the rows keep no per-replay throughputs (written by an earlier version of the study)"
ONE_REPLAY = "a single replay per point; an interval over replays needs at least 2"
REPLAYS_DIFFER = "the two rows hold different numbers of replays"
NO_RATIO = "the replays give no finite ratio"


def _replays(m) -> np.ndarray | None:
    """The row's output tokens/s of each replay, ``[R]`` in replay order; None for a row without
    them (or with a replay that has none)."""
    values = m.get("replay_output_tokens_per_s")
    if values is None or any(v is None for v in values):
        return None
    return np.asarray(values, np.float64)


def _no_interval(m) -> str | None:
    """Why row ``m``'s throughput has no interval over replays, or None if it has one."""
    values = _replays(m)
    if values is None:
        return NO_REPLAYS
    return ONE_REPLAY if len(values) < 2 else None


def mean_throughput(m) -> float:
    """Output tokens/s, the mean over the row's replays (replay 0's value for an older row)."""
    values = _replays(m)
    return float(values.mean()) if values is not None else m["output_tokens_per_s"]


def throughput(m) -> stats.Interval | None:
    """Output tokens/s: the mean over the row's replays with its 95% bootstrap interval over the
    replays (each a whole replay of its own trace); None with fewer than 2 replays."""
    if _no_interval(m):
        return None
    return stats.bootstrap(stats.mean, _replays(m))


def _unreplayed(a, b) -> str | None:
    """Why rows ``a`` and ``b`` cannot be compared replay by replay, or None if they can."""
    reason = _no_interval(a) or _no_interval(b)
    if reason is None and len(_replays(a)) != len(_replays(b)):
        return REPLAYS_DIFFER
    return reason


def throughput_ratio(a, b) -> stats.Interval | None:
    """Output tokens/s of row ``a`` over that of row ``b``, the ratio of their means over replays,
    paired by replay: replay r of both points replays the same trace (seed + r). None where
    ``_unreplayed`` gives a reason or the replays give no finite ratio."""
    if _unreplayed(a, b):
        return None
    try:
        return stats.bootstrap_ratio(stats.mean, _replays(a), _replays(b), paired=True)
    except ValueError:
        return None


def _judge_ratio(a, b, ratio: stats.Interval | None, **kwargs) -> results.Verdict:
    """``results.verdict`` of a throughput ratio over replays; without an interval it says why."""
    return results.verdict(ratio, units="replays", missing=_unreplayed(a, b) or NO_RATIO,
                           **kwargs)


def _replay_count(metrics: list[dict]) -> str:
    """How many replays these rows' throughputs (``metrics`` of each row) are the mean of."""
    counts = {1 if _replays(m) is None else len(_replays(m)) for m in metrics}
    if counts == {1}:
        return "one replay"
    if len(counts) == 1:
        return f"mean of {counts.pop()} replays"
    return f"mean of each point's replays ({min(counts)} to {max(counts)})"


def _overall(judged: list[tuple[int, results.Verdict]]) -> str:
    """A target of several parts, each ``(sign, verdict)`` (sign +1: the part is met when the
    verdict's side is +1; -1: when it is -1): met if every part is, not met if any part's interval
    lies on the wrong side, otherwise not judged or not distinguishable."""
    sides = [sign * v.side for sign, v in judged]
    if any(side < 0 for side in sides):
        return "not met"
    if all(side > 0 for side in sides):
        return "met"
    missing = [v.text for _, v in judged if v.text.startswith("not judged")]
    return missing[0] if missing else "not distinguishable at this sample size"


def _shown(m, metric: str):
    """``metric`` with its interval where the row allows one, else the row's plain number (output
    tokens/s: the mean over its replays)."""
    found = interval(m, metric)
    if metric == "output_tokens_per_s":
        return found if found is not None else mean_throughput(m)
    if found is not None or metric in m:
        return found if found is not None else m[metric]
    units = _units(m)  # a page metric (max_tbt_p99_s) of a row with a single value
    kept = None if units is None else _kept([units[n] for n in RESAMPLED[metric][1]])[0]
    return None if kept is None or not kept.size else float(np.percentile(kept, 99))


def _with_intervals(row, metrics=(*RESAMPLED, "output_tokens_per_s")) -> dict:
    return results.with_metrics(row, **{name: _shown(row["metrics"], name) for name in metrics})


def _fmt(value, number_format: str) -> str:
    return results.format_value(value, number_format)


def _ms(value, number_format: str = "{:.1f}") -> str:
    """Seconds shown in milliseconds, an Interval with its bounds."""
    if isinstance(value, stats.Interval):
        value = dataclasses.replace(value, value=1e3 * value.value, low=1e3 * value.low,
                                    high=1e3 * value.high)
    elif value is not None:
        value = 1e3 * value
    return _fmt(value, number_format)


def _times(ratio) -> str:
    """A ratio as ``2.50x``, an Interval as ``2.50x [2.41, 2.58]``."""
    if isinstance(ratio, stats.Interval):
        return f"{ratio.value:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{ratio:.2f}x"


def _difference(interval_: stats.Interval | None, verdict: results.Verdict, unit: str,
                number_format: str) -> str:
    """``-0.10 [-0.12, -0.08] s: lower``, or only the verdict where there is no interval."""
    if interval_ is None:
        return verdict.text
    value = _ms(interval_, number_format) if unit == "ms" else _fmt(interval_, number_format)
    return f"{value} {unit}: {verdict}"


def _policy_rows(rows):
    return [r for r in rows if r["config"]["trace"]["prompts"] == "short"]


def _chunk_rows(rows):
    return [r for r in rows if r["config"]["trace"]["prompts"] == "long"]


def _policy_metrics(rows, policy, output, rate) -> dict | None:
    for row in _policy_rows(rows):
        c = row["config"]
        if (c["policy"], c["trace"]["output"], c["trace"]["rate"]) == (policy, output, rate):
            return row["metrics"]
    return None


def _against_static(cont, stat) -> dict:
    """Continuous against static on the same traces: the throughput ratio (paired by replay, or
    the plain ratio of the means for rows without an interval) and the latency differences,
    continuous - static, paired over the requests of replay 0, each with its verdict."""
    ratio = throughput_ratio(cont, stat)
    out = {"ratio": ratio if ratio is not None else (mean_throughput(cont)
                                                    / mean_throughput(stat)),
           "ratio_verdict": _judge_ratio(cont, stat, ratio, threshold=1.0,
                                         above="continuous higher", below="static higher"),
           "target": _judge_ratio(cont, stat, ratio, threshold=2.2, above="met",
                                  below="not met")}
    for q in ("p50", "p99"):
        difference = paired(cont, stat, f"latency_{q}_s")
        out[q] = difference
        out[f"{q}_verdict"] = _judge(cont, stat, difference, above="higher", below="lower")
    return out


def _ideal(m) -> tuple[float, str]:
    """Continuous batching's ideal gain at saturation for the row's traces (the mean over its
    replays' traces where it keeps them) and the words that introduce it on the page."""
    values = m.get("replay_static_waste_factor")
    if values is None or len(values) < 2:
        return m["static_waste_factor"], "For this trace the ideal gain at saturation is"
    return (float(np.mean(values)),
            f"Averaged over these {len(values)} traces, the ideal gain at saturation is")


def _comparison(rows) -> str:
    top = max(r["config"]["trace"]["rate"] for r in _policy_rows(rows))
    lines, long_tail, chosen = [], None, []
    for output in ("long_tail", "fixed"):
        cont = _policy_metrics(rows, "continuous", output, top)
        stat = _policy_metrics(rows, "static", output, top)
        if cont is None or stat is None:
            continue
        got = _against_static(cont, stat)
        if output == "long_tail":
            long_tail = (cont, stat, got)
        lines.append(
            f"- **{output}** outputs (replay 0's trace: mean {stat['mean_output_len']:.1f}, max "
            f"{stat['max_output_len']} tokens), arrival rate {top:g}/s (saturation): continuous "
            f"{_fmt(_shown(cont, 'output_tokens_per_s'), '{:.0f}')} vs static "
            f"{_fmt(_shown(stat, 'output_tokens_per_s'), '{:.0f}')} output tokens/s = "
            f"**{_times(got['ratio'])}** ({got['ratio_verdict']}); p50 latency "
            f"{_fmt(_shown(cont, 'latency_p50_s'), '{:.2f}')} s vs "
            f"{_fmt(_shown(stat, 'latency_p50_s'), '{:.2f}')} s (paired difference "
            f"{_difference(got['p50'], got['p50_verdict'], 's', '{:+.2f}')}); p99 latency "
            f"{_fmt(_shown(cont, 'latency_p99_s'), '{:.2f}')} s vs "
            f"{_fmt(_shown(stat, 'latency_p99_s'), '{:.2f}')} s "
            f"({_difference(got['p99'], got['p99_verdict'], 's', '{:+.2f}')}); slot occupancy "
            f"{cont['slot_occupancy']:.2f} vs {stat['slot_occupancy']:.2f}; p50 TPOT "
            f"{_ms(_shown(cont, 'tpot_p50_s'))} ms vs "
            f"{_ms(_shown(stat, 'tpot_p50_s'))} ms.")
        chosen.append(cont)
        chosen.append(stat)
    heading = "## Continuous over static, at saturation (computed from the rows)"
    if long_tail is None:
        return "\n".join([heading, "", *lines, "", "Target: not measured (these rows hold no "
                           "static and continuous points of the long-tailed trace at the top "
                           "rate)."])
    how = (f"Output tokens/s: {_replay_count(chosen)}; the ratio "
           f"continuous / static is the ratio of the means, its interval paired replay by "
           f"replay (replay r of both policies replays the trace drawn with seed + r). Latency, "
           f"TPOT and occupancy: replay 0, the latency differences continuous - static paired "
           f"request by request over its requests.")
    cont, stat, got = long_tail
    overall = _overall([(1, got["target"]), (-1, got["p50_verdict"]), (-1, got["p99_verdict"])])
    gain = got["ratio"].value if isinstance(got["ratio"], stats.Interval) else got["ratio"]
    ideal, ideal_words = _ideal(stat)
    loads = [r["metrics"]["load_avg_1m_before"] for r in rows]
    c = rows[0]["config"]["engine"]
    return "\n".join([
        heading, "", how, "", *lines, "",
        f"Target (long-tailed trace at saturation: continuous >= 2.2x static output tokens/s with "
        f"lower p50 and p99 latency): **{overall}** (throughput ratio "
        f"{_times(got['ratio'])} against 2.2: {got['target']}; p50 latency "
        f"{_difference(got['p50'], got['p50_verdict'], 's', '{:+.2f}')}; p99 latency "
        f"{_difference(got['p99'], got['p99_verdict'], 's', '{:+.2f}')})."
        + (f" The throughput verdict rests on {got['ratio'].units} replays: their interval "
           f"holds the run-to-run timing noise and the draw of the trace, but with this few "
           f"replays the percentile bootstrap is coarse (see the note on the brackets); the "
           f"latency verdicts rest on replay 0's requests alone."
           if isinstance(got["ratio"], stats.Interval) else ""), "",
        f"The seed's \"up to 23x\" (Anyscale: OPT-13B on an A100, continuous batching in vLLM "
        f"against naive static batching in Hugging Face) and Orca's 36.9x (GPT-3-sized models, "
        f"against FasterTransformer at equal latency) are about {23 / gain:.0f}x and "
        f"{36.9 / gain:.0f}x the {gain:.2f}x measured here. The difference is what the "
        f"comparison holds fixed. Here both policies get the same {c['num_slots']} "
        f"slots of one static cache, so continuous batching can only win back the slot time "
        f"that static batching wastes: slots idle while a batch waits for its longest request "
        f"(slot occupancy {cont['slot_occupancy']:.2f} vs {stat['slot_occupancy']:.2f} on the "
        f"long-tailed trace, replay 0) and requests idle while a full batch forms. {ideal_words} "
        f"{ideal:.2f}x: the slot-steps that "
        f"full static batches hold (each row until its batch's longest request ends) over the "
        f"slot-steps the requests need. The measured gain "
        f"{'falls short of it' if gain < ideal else 'reaches it'}. "
        f"Continuous batching is not free either: the prompts admitted at an engine call are "
        f"prefilled together (one compiled call, written straight into their slots' cache "
        f"rows) before that call's decode rounds, which stalls every running slot for that "
        f"prefill, a slot freed inside a {c['steps_per_call']}-round engine call idles until "
        f"the call ends, and "
        f"the trace drains at the end with few slots busy. With fixed lengths the bound is 1x "
        f"and the policies tie. The large published gains include more than "
        f"scheduling: with paged KV memory, vLLM and Orca fit many more concurrent requests "
        f"than a padded static batch of maximal length can, so their continuous batches are much "
        f"larger than the static ones they are compared to, and on a GPU a larger decode batch "
        f"costs little more per step (decoding is memory-bound), so throughput grows with the "
        f"batch. Our engine computes every slot at every step (static shapes), so a larger batch "
        f"would cost proportionally more on this 2-core CPU, and the slot count is held equal. "
        f"The machine was shared: 1-minute load average {min(loads):.1f} to {max(loads):.1f} "
        f"on {rows[0]['provenance'].get('cpu_count')} CPUs at the start of the points.",
    ])


def _chunked_target(judged: list[tuple[int, str, results.Verdict]]) -> str:
    """Chunked prefill lowers p99 TTFT or the p99 longest gap: met if some chunk size's paired
    difference lies below 0, not met if every one lies above, otherwise undecided."""
    lowered = [f"chunks of {chunk}: {what}" for chunk, what, v in judged if v.side < 0]
    if lowered:
        return f"**met** ({'; '.join(lowered)})"
    if all(v.side > 0 for _, _, v in judged):
        return "**not met** (chunking raises both at every chunk size)"
    missing = [v.text for _, _, v in judged if v.text.startswith("not judged")]
    return f"**{missing[0] if missing else 'not distinguishable at this sample size'}**"


def _chunked_prefill(rows, out_dir, page) -> list[pathlib.Path]:
    """The long-prompt points: whole against chunked prefill, computed from the rows."""
    chosen = _chunk_rows(rows)
    if not chosen:
        return []
    c = chosen[0]["config"]
    top = max(r["config"]["trace"]["rate"] for r in chosen)

    def at(chunk):
        for row in chosen:
            cfg = row["config"]
            if (cfg["engine"]["prefill_chunk"], cfg["trace"]["rate"]) == (chunk, top):
                return row["metrics"]
        return None

    whole = at(0)
    lines, judged = [], []
    for chunk in sorted({r["config"]["engine"]["prefill_chunk"] for r in chosen} - {0}):
        part = at(chunk)
        if part is None or whole is None:
            continue
        ttft, gap = paired(part, whole, "ttft_p99_s"), paired(part, whole, "max_tbt_p99_s")
        ttft_v = _judge(part, whole, ttft, above="higher", below="lower")
        gap_v = _judge(part, whole, gap, above="higher", below="lower")
        judged += [(chunk, "p99 TTFT", ttft_v), (chunk, "p99 longest gap", gap_v)]
        ratio = throughput_ratio(part, whole)
        ratio_v = _judge_ratio(part, whole, ratio, threshold=1.0, above="chunked higher",
                               below="whole higher")
        shown_ratio = ratio if ratio is not None else mean_throughput(part) / mean_throughput(
            whole)
        lines.append(
            f"- chunks of {chunk}: p99 TTFT {_fmt(_shown(part, 'ttft_p99_s'), '{:.3f}')} s vs "
            f"{_fmt(_shown(whole, 'ttft_p99_s'), '{:.3f}')} s whole (paired difference "
            f"{_difference(ttft, ttft_v, 's', '{:+.3f}')}); p99 of each request's longest time "
            f"between tokens {_ms(_shown(part, 'max_tbt_p99_s'))} ms vs "
            f"{_ms(_shown(whole, 'max_tbt_p99_s'))} ms "
            f"({_difference(gap, gap_v, 'ms', '{:+.1f}')}); p99 time between tokens, every gap "
            f"pooled, {_ms(part['tbt_p99_s'])} ms vs "
            f"{_ms(whole['tbt_p99_s'])} ms (no interval); output "
            f"{_fmt(_shown(part, 'output_tokens_per_s'), '{:.0f}')} vs "
            f"{_fmt(_shown(whole, 'output_tokens_per_s'), '{:.0f}')} tokens/s "
            f"({_replay_count([part, whole])}) = {_times(shown_ratio)} ({ratio_v}).")
    page.text("\n".join([
        "## Chunked prefill on long prompts (computed from the rows)", "",
        f"Continuous batching, {c['engine']['num_slots']} slots of {c['engine']['max_len']} "
        f"tokens, prompts log-normal (median {c['trace']['prompt_long']['median']:g}, sigma "
        f"{c['trace']['prompt_long']['sigma']:g}, capped at {c['trace']['prompt_long']['cap']}), "
        f"long-tailed outputs as above. Whole: each admitted prompt is prefilled entirely in the "
        f"engine call that admits it, so every running slot waits for it. Chunked: each waiting "
        f"prompt enters at most that many tokens per engine call, between the decode rounds of "
        f"the running slots (Sarathi-Serve). Time between tokens: the gap between two engine "
        f"calls that gave a request tokens. The rows keep each request's longest gap, so the "
        f"judged tail is the p99 over requests of that longest gap; the pooled p99 over every "
        f"gap of every request has no interval. Latency differences are chunked - whole, paired "
        f"request by request over replay 0 (the same trace); the throughput ratio chunked / "
        f"whole is paired replay by replay (replay r of both replays the trace drawn with seed "
        f"+ r). At {top:g} requests/s:", "",
        *lines, "",
        "Target (chunked prefill lowers p99 TTFT or the p99 longest time between tokens on this "
        "trace): "
        + (f"{_chunked_target(judged)}; {len(judged)} comparisons, each at 95%, so one that "
           f"barely excludes 0 is weak evidence." if judged else
           "not measured (these rows hold no whole and chunked points at the top rate).")]))
    written = []
    where = {"config.trace.prompts": "long"}
    shown = [_with_intervals(r) for r in chosen]
    for metric, fmt, caption in (
            ("ttft_p99_s", "{:.3f}", "p99 time to first token (s)"),
            ("max_tbt_p99_s", "{:.4f}", "p99 over requests of each request's longest time "
                                        "between tokens (s)"),
            ("tbt_p99_s", "{:.4f}", "p99 time between tokens, every gap pooled (s)"),
            ("latency_p99_s", "{:.2f}", "p99 end-to-end latency (s)"),
            ("output_tokens_per_s", "{:.0f}",
             f"output tokens/s ({_replay_count([r['metrics'] for r in chosen])})")):
        table = results.pivot_table(shown, index="config.engine.prefill_chunk",
                                    columns="config.trace.rate", values=f"metrics.{metric}",
                                    where=where)
        csv = out_dir / f"batching_chunked_{metric}.csv"
        page.table(table, csv, number_format=fmt,
                   caption=f"**long prompts: {caption}**, by prefill chunk (0: whole prompts) and "
                           f"arrival rate (requests/s)")
        written.append(csv)
    return written


def _brackets(rows) -> str:
    """What the brackets on the page are (their unit and what they leave out), or why some points
    have none."""
    metrics = [r["metrics"] for r in rows]
    if any(_units(m) is None for m in metrics):
        requests = ("No intervals over requests: some rows keep no per-request values (written by "
                    "an earlier version of the study; rerun it for intervals). Their latencies, "
                    "TTFT and TPOT show plain numbers and the claims that rest on them are not "
                    "judged.")
    else:
        requests = (
            f"Brackets on latency, TTFT, TPOT and the longest gap: 95% percentile bootstrap "
            f"interval over the completed requests of the point's replay 0 (a trace has "
            f"{rows[0]['config']['trace']['num_requests']}; 2,000 resamples, fixed seed; "
            f"`decodelab.measure.stats`); a percentile's interval takes that percentile of each "
            f"resample. A p99 over this many requests interpolates between the two largest "
            f"values and no resample exceeds the largest, so its interval is rough and its upper "
            f"bound is at most the largest value measured. Two points on the same trace "
            f"(continuous against static, chunked against whole prefill) are compared request "
            f"by request: a paired bootstrap, since request i is the same request in both; a "
            f"claim is called only when its interval excludes 0. These intervals are over one "
            f"replay's requests: the run-to-run timing noise of the machine is in none of them.")
    reasons = sorted({_no_interval(m) for m in metrics} - {None})
    if reasons:
        replays = (f"No intervals on output tokens/s for some points ({'; '.join(reasons)}): "
                   f"they show the plain number, and the throughput claims that rest on them are "
                   f"not judged.")
    else:
        count = _replay_count(metrics)
        replays = (
            f"Brackets on output tokens/s: the {count} of the point (replay r replays the trace "
            f"drawn with seed + r, on a fresh engine after a warm-up) with a 95% percentile "
            f"bootstrap interval over the replays (2,000 resamples, fixed seed). The unit is a "
            f"whole replay, because throughput (output tokens over the makespan) is one number "
            f"of a replay, not a sum over requests. The interval holds the run-to-run timing "
            f"noise of the shared machine and the draw of each trace (arrivals, prompt and "
            f"output lengths) from the configured distributions; it leaves out other machines, "
            f"other loads and other distributions. With this few replays the percentile "
            f"bootstrap is coarse: its bounds lie within the smallest and largest replay, and "
            f"for normally distributed replays only about 85% of such intervals cover the true "
            f"mean at 5 replays, not 95%; read it as rough, and a verdict that barely clears its "
            f"threshold as weak. A ratio of two points (continuous over static, chunked over "
            f"whole) is the ratio of their means, its interval paired replay by replay: replay "
            f"r of both replays the same trace, so what the trace contributes largely cancels. "
            f"The rows also keep each replay's p50 and p99 latency, p99 TTFT and makespan "
            f"(`replay_*` lists) to read the run-to-run spread; the latency intervals do not "
            f"use them.")
    return f"{requests}\n\n{replays}"


def report(rows, out_dir) -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    c = _policy_rows(rows)[0]["config"]
    page = results.Page("Static, dynamic and continuous batching", rows)
    page.text(
        f"One `SlotEngine` with {c['engine']['num_slots']} slots of {c['engine']['max_len']} "
        f"tokens replays the same seeded Poisson traces ({c['trace']['num_requests']} requests, "
        f"prompts uniform on {c['trace']['prompt_short']['low']}.."
        f"{c['trace']['prompt_short']['high']} "
        f"tokens; outputs fixed at {c['trace']['output_fixed']['length']} or long-tailed "
        f"log-normal, median {c['trace']['output_long_tail']['median']:g}, sigma "
        f"{c['trace']['output_long_tail']['sigma']:g}, capped at "
        f"{c['trace']['output_long_tail']['cap']}) under each policy: static (wait for "
        f"{c['engine']['num_slots']} requests, run the batch to its end), dynamic (up to "
        f"{c['engine']['num_slots']} requests after at most {c['dynamic_max_wait']:g} s of "
        f"waiting, run to the end), continuous (fill free slots before every engine call). "
        f"Model: the `small` preset with random weights (speed does not depend on weight values; "
        f"there is no EOS, each request runs its budget). Sampling temperature "
        f"{c['trace']['temperature']:g}, top-p {c['trace']['top_p']:g}, one seed per request; "
        f"every request's tokens are the same under every policy (tests/test_serving_*.py). "
        f"{c['engine']['steps_per_call']} decode rounds per engine call.\n\n"
        "Clock: wall clock (`time.perf_counter`); prefill, steps and host work take their real "
        "time, idle gaps (engine empty, next arrival later) are skipped rather than slept, which "
        "changes no measured duration. TTFT = first token - arrival (queueing included); TPOT = "
        "(latency - TTFT) / (tokens - 1); latency = finish - arrival; throughput = output tokens "
        "/ makespan (first arrival to last finish); occupancy = busy slot-seconds / (slots x "
        "makespan); time between tokens = the gap between two engine calls that gave a request "
        f"tokens. Output tokens/s is shown as the {_replay_count([r['metrics'] for r in rows])} "
        "(replay r of every point replays the trace drawn with seed + r, the same trace for "
        "every policy); every other metric is replay 0's. Each row also holds every request's "
        "latency, TTFT, TPOT, longest gap and output length in replay 0 (`per_request_*` lists) "
        "and each replay's throughput, latency percentiles, p99 TTFT and makespan (`replay_*` "
        "lists).")
    page.text(_brackets(rows))
    page.text(_comparison(rows))
    written = _chunked_prefill(rows, out_dir, page)
    shown = [_with_intervals(r) for r in _policy_rows(rows)]
    count = _replay_count([r["metrics"] for r in _policy_rows(rows)])
    # Latency against throughput: the throughput (the x axis) is the plain mean over replays.
    latency_shown = [results.with_metrics(_with_intervals(r, ("latency_p50_s", "latency_p99_s")),
                                          output_tokens_per_s=mean_throughput(r["metrics"]))
                     for r in _policy_rows(rows)]
    for output in ("long_tail", "fixed"):
        where = {"config.trace.output": output, "config.trace.prompts": "short"}
        for metric, fmt, caption in (
                ("output_tokens_per_s", "{:.0f}", f"output tokens/s ({count})"),
                ("latency_p50_s", "{:.2f}", "p50 end-to-end latency (s)"),
                ("latency_p99_s", "{:.2f}", "p99 end-to-end latency (s)"),
                ("ttft_p50_s", "{:.2f}", "p50 time to first token (s)"),
                ("tpot_p50_s", "{:.4f}", "p50 time per output token (s)"),
                ("slot_occupancy", "{:.2f}", "slot occupancy")):
            table = results.pivot_table(shown, index="config.policy",
                                        columns="config.trace.rate", values=f"metrics.{metric}",
                                        where=where)
            csv = out_dir / f"batching_{output}_{metric}.csv"
            page.table(table, csv, number_format=fmt,
                       caption=f"**{output}: {caption}**, by policy and arrival rate (requests/s)")
            written.append(csv)
        path = results.line_plot(shown, out_dir / f"batching_{output}_throughput.png",
                                 x="config.trace.rate", y="metrics.output_tokens_per_s",
                                 group="config.policy", where=where, logx=True,
                                 title=f"{output}: throughput vs arrival rate")
        page.image(path, f"{output}: output tokens/s ({count}) against arrival rate, one line "
                         f"per policy (bars: 95% intervals over replays)")
        written.append(path)
        for q in ("p50", "p99"):
            path = results.line_plot(latency_shown,
                                     out_dir / f"batching_{output}_latency_{q}.png",
                                     x="metrics.output_tokens_per_s", y=f"metrics.latency_{q}_s",
                                     group="config.policy", where=where,
                                     title=f"{output}: {q} latency vs throughput")
            page.image(path, f"{output}: replay 0's {q} latency against output tokens/s "
                             f"({count}), one line per policy (bars: 95% intervals over replay "
                             f"0's requests)")
            written.append(path)
    # The per-request lists stay in rows.jsonl; the table holds the scalar metrics.
    everything = results.points_table(rows)
    page.table(everything, out_dir / "batching.csv", caption="**Every point**, every metric.")
    return [page.write(out_dir / "batching.md"), out_dir / "batching.csv", *written]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
