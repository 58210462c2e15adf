"""The decode_speed page's tables, plot, method and caveats, from the benchmark's rows alone.

Every table takes the rows of ``experiment.run`` (all three sweeps together: the main ``speed``
sweep, ``max_len`` and ``breakdown``) and reads its own sweep's rows (``speed.metric_rows``); the
speed and ratio cells are Intervals where the rows keep their repetitions
(``speed.with_intervals``).
"""

from __future__ import annotations

import functools
import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import ablation, constrained, sampling_cost, timing, weight_cost
from decodelab.measure.peers import HF_WARMUP_TOKENS
from decodelab.measure.stats import Interval
from decodelab.report import speed
from decodelab.report.pages import backend, other_cores
from decodelab.report.plots import Axes, line_plot
from decodelab.report.tables import Table, format_number, format_value

Rows = Sequence[Mapping[str, Any]]
# The plot's lines: the metric of each implementation's tokens/s and its name.
IMPLEMENTATIONS = {"tokens_per_s": "decodelab", "hf_tokens_per_s": "transformers",
                   "nocache_tokens_per_s": "no cache"}


def speed_metrics(rows: Rows) -> list[dict]:
    """The main sweep's metrics with their intervals."""
    return [speed.with_intervals(m) for m in speed.metric_rows(rows)]


def main_table(rows: Rows) -> Table:
    """Per preset and batch: tokens/s and the ratios the targets judge."""
    return Table(["preset", "batch", "decodelab tok/s", "decodelab / roofline",
                  "decodelab / transformers", "cache speed-up"],
                 [[m["preset"], m["batch_size"], m["tokens_per_s"], m["roofline_ratio"],
                   m["speed_vs_hf"], m["cache_speedup"]] for m in speed_metrics(rows)])


def throughput_table(rows: Rows) -> Table:
    """Output tokens per second (all rows together) of every implementation, and the ratios."""
    columns = ["preset", "params (M)", "batch", "decodelab tok/s", "transformers tok/s",
               "no-cache tok/s", "roofline tok/s", "decodelab / roofline",
               "decodelab / transformers", "cache speed-up", "sampled tok/s"]
    body = [[m["preset"], m["params"] / 1e6, m["batch_size"], m["tokens_per_s"],
             m["hf_tokens_per_s"], m["nocache_tokens_per_s"], m["roofline_tokens_per_s"],
             m["roofline_ratio"], m["speed_vs_hf"], m["cache_speedup"],
             m.get("sampled_tokens_per_s")] for m in speed_metrics(rows)]
    return Table(columns, body)


def min_median_max(m: Mapping[str, Any], key: str) -> str | None:
    reps = m.get(key)
    if not reps:
        return None
    return " / ".join(format_number(x) for x in (min(reps), statistics.median(reps), max(reps)))


def latency_table(rows: Rows) -> Table:
    """Compile time of decodelab's two programs, prefill (one ``generate`` call with one new
    token), one decode step against its roofline, and the peers' time per token."""
    columns = ["preset", "batch", "compile s", "generate s (min / median / max)", "prefill ms",
               "decodelab step ms", "roofline step ms", "bound by", "transformers ms/token",
               "no-cache ms/token", "sampled step ms", "sampled / greedy step"]
    body = [[m["preset"], m["batch_size"], m["compile_s"], min_median_max(m, "generate_reps_s"),
             m["prefill_ms"], m["step_ms"], m["roofline_step_ms"], m["roofline_bound"],
             m["hf_step_ms"], None if m["nocache_generate_s"] is None
             else 1e3 * m["nocache_generate_s"] / m["new_tokens"],
             m.get("sampled_step_ms"), m.get("sampled_vs_greedy")] for m in speed_metrics(rows)]
    return Table(columns, body)


def max_len_table(rows: Rows) -> Table:
    """Step time against cache slots at the same live tokens, relative to the smallest cache."""
    metrics = speed.metric_rows(rows, "max_len")
    columns = ["preset", "batch", "max_len", "live tokens at the end", "decodelab step ms",
               "step / step at the smallest max_len", "first call ms (prefill, cache set-up)",
               "whole call / whole call at the smallest max_len", "sampled step ms"]
    body = []
    for m in metrics:
        base, prefix = speed.at_smallest_cache(m, metrics)
        body.append([m["preset"], m["batch_size"], m["max_len"], m["prompt_len"] + m["new_tokens"],
                     m["step_ms"], timing.ratio(m["step_ms"], base[f"{prefix}step_ms"] or None),
                     m["prefill_ms"], timing.ratio(m["generate_s"], base[f"{prefix}generate_s"]),
                     m.get("sampled_step_ms")])
    return Table(columns, body)


def weights_table(rows: Rows) -> Table:
    """The weights study: the float32 step and each 16-bit storage's step over it, with the
    parameter bytes each holds."""
    storages = weight_cost.STORAGES
    columns = ["preset", "batch", "float32 step ms", "float32 MB",
               *[f"{name} {what}" for name in storages for what in ("step / float32", "MB")]]
    body = [[m["preset"], m["batch_size"], m["step_ms"], m["param_bytes"] / 1e6,
             *[value for name in storages
               for value in (speed.interleaved_step_ratio(m, f"{name}_"),
                             m[f"{name}_param_bytes"] / 1e6)]]
            for m in speed.metric_rows(rows, "weights")]
    return Table(columns, body)


def percent(ratio: float | Interval | None) -> str:
    if isinstance(ratio, Interval):
        return f"{100 * ratio.value:.0f}% [{100 * ratio.low:.0f}%, {100 * ratio.high:.0f}%]"
    return "n/a" if ratio is None else f"{100 * ratio:.0f}%"


def breakdown_table(rows: Rows) -> Table:
    """Per row and mode, each part's ms per step and its share of the whole step."""
    columns = ["preset", "batch", "decoding", "step ms", *[
        f"{name} ms (share)" for name in ablation.PART_LABELS.values()]]
    body = []
    for m in speed.metric_rows(rows, "breakdown"):
        for mode in ("greedy", "sampled"):
            full = m.get(f"breakdown_{mode}_full_step_ms")
            if full is None:
                continue
            cells = []
            for part in ablation.PART_LABELS:
                ms = m[f"breakdown_{mode}_{part}_ms"]
                cells.append(f"{format_number(ms)} ({percent(ms / full if full > 0 else None)})")
            body.append([m["preset"], m["batch_size"], mode, full, *cells])
    return Table(columns, body)


def llama_rows(rows: Rows) -> list[dict]:
    """The main sweep's rows that ran llama.cpp (a pretrained preset at batch 1)."""
    return [m for m in speed_metrics(rows) if m.get("llama_tokens_per_s") is not None]


def llama_table(rows: Rows) -> Table:
    """decodelab beside llama.cpp on the same GGUF file: the bytes each reads per token, speed,
    and the fraction of each side's own roofline."""
    columns = ["preset", "implementation", "weights", "MB read per token", "tok/s", "step ms",
               "roofline step ms", "step / own roofline", "decodelab tok/s / this"]
    body = []
    for m in llama_rows(rows):
        body.append([m["preset"], "decodelab", "float32 (dequantized by decodelab)",
                     m["step_bytes"] / 1e6, m["tokens_per_s"], m["step_ms"],
                     m["roofline_step_ms"], m["roofline_ratio"], 1.0])
        for key, weights in (("llama_f32", "float32 (converted by llama.cpp)"),
                             ("llama", "as stored in the file")):
            body.append([m["preset"], f"llama.cpp {m['llama_version']}", weights,
                         m[f"{key}_bytes_per_token"] / 1e6, m[f"{key}_tokens_per_s"],
                         m[f"{key}_step_ms"], m[f"{key}_roofline_step_ms"],
                         m[f"{key}_roofline_ratio"], m["speed_vs_" + key]])
    return Table(columns, body)


def csv_tables(rows: Rows) -> dict:
    """The page's further CSVs (``decode_speed_<key>.csv``): every column of every table."""
    tables = {"throughput": throughput_table, "latency": latency_table}
    if llama_rows(rows):
        tables["llama_cpp"] = llama_table
    if speed.metric_rows(rows, "max_len"):
        tables["max_len"] = max_len_table
    if speed.metric_rows(rows, "breakdown"):
        tables["breakdown"] = breakdown_table
    for study in ("sampling", "samplers"):
        if speed.metric_rows(rows, study):
            tables[study] = functools.partial(settings_table, study=study)
    if speed.metric_rows(rows, "constrained"):
        tables["constrained"] = constrained_table
    if speed.metric_rows(rows, "weights"):
        tables["weights"] = weights_table
    return tables


def constrained_table(rows: Rows) -> Table:
    """The constrained study: a free greedy step and the same step under a regex."""
    return Table(["preset", "batch", "free step ms", "constrained step ms", "constrained / free"],
                 [[m["preset"], m["batch_size"], m["free_step_ms"], m["constrained_step_ms"],
                   constrained.step_ratio(m)] for m in speed.metric_rows(rows, "constrained")])


def settings_table(rows: Rows, study: str = "sampling") -> Table:
    """Each setting's step over the greedy step of the same row: the sampling study's settings,
    with decodelab / transformers with the same processors, or the samplers study's."""
    sampling = study == "sampling"
    settings = list(sampling_cost.SETTINGS if sampling else
                    [*sampling_cost.SAMPLERS, "contrastive"])
    columns = ["preset", "batch", "greedy step ms",
               *[f"{sampling_cost.LABELS[name]} / greedy" for name in settings],
               *(["decodelab / transformers (both sampling)"] if sampling else [])]
    body = [[m["preset"], m["batch_size"], m["step_ms"],
             *[speed.setting_over_greedy(name)(m) for name in settings],
             *([speed.over_peer_sampled(m)] if sampling else [])]
            for m in speed.metric_rows(rows, study)]
    return Table(columns, body)


def plot(rows: Rows, path: pathlib.Path) -> pathlib.Path:
    """Output tokens/s against batch size, one line per preset and implementation."""
    lines = [{"metrics": {"batch_size": m["batch_size"], "tokens_per_s": m[key],
                          "line": f"{m['preset']}, {name}"}}
             for key, name in IMPLEMENTATIONS.items() for m in speed_metrics(rows)]
    return line_plot(lines, path, x="metrics.batch_size", y="metrics.tokens_per_s",
                     group="metrics.line",
                     axes=Axes(logx=True, logy=True, title="output tokens/s vs batch size"))


# --- method and caveats -------------------------------------------------------------------------


def value_range(values: Sequence[float], unit: str, digits: int = 1) -> str:
    """``"20.7-41.5 GB/s"`` (one value if both ends print alike)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo} {unit}" if lo == hi else f"{lo}-{hi} {unit}"


def models_text(metrics: Sequence[Mapping[str, Any]], vocab_size: int) -> str:
    """What the rows ran: size presets with random weights, pretrained ones with their own."""
    def presets_with(kind: str) -> list[str]:
        return list(dict.fromkeys(m["preset"] for m in metrics
                                  if m.get("weights", "random") == kind))

    parts = []
    if presets_with("random"):
        names = ", ".join(f"`{p}`" for p in presets_with("random"))
        parts.append(f"the {names} presets with random weights at vocabulary {vocab_size} (speed "
                     "does not depend on what the weights are)")
    for preset in presets_with("pretrained"):
        row = next(m for m in metrics if m["preset"] == preset)
        parts.append(f"the pretrained `{preset}` ({row['params'] / 1e6:.0f}M parameters, "
                     f"vocabulary {row['vocab_size']}) with its real weights, dequantized from "
                     "its GGUF file to float32")
    return "; and ".join(parts)


def study_config(rows: Rows, study: str = "speed") -> dict:
    """The resolved config of ``study``'s first row (the main sweep's by default)."""
    found = [r["config"] for r in rows if r["config"].get("study", "speed") == study]
    if not found:
        raise ValueError(f"rows must hold rows of the study {study!r}; run its sweep into the "
                         "same workdir (the main sweep: `--config=configs/bench_decode.py`)")
    return found[0]


def method(rows: Rows) -> list[str]:
    """How each number is made, in at most 8 lines."""
    config, metrics = study_config(rows), speed_metrics(rows)
    N, P, sampled = config["new_tokens"], config["prompt_len"], config.get("sampled", {})
    first, versions = metrics[0], "; ".join(sorted({m["hf_version"] for m in metrics}))
    lines = [
        f"Greedy decoding of exactly {N} new tokens per row after a {P}-token prompt (random ids; "
        f"EOS ignored) with {models_text(metrics, config['vocab_size'])}"
        + (f"; sampled decoding (temperature {sampled['temperature']}, top-p {sampled['top_p']} "
           "in every row) of the same rows beside it" if sampled.get("enabled") else "") + ".",
        f"Medians of {config['repeats']} timed runs after a warm-up run (no cache: "
        f"{config['nocache']['repeats']} at each length; transformers: "
        f"{config['peer']['repeats']}); the 95% intervals resample the runs: two programs "
        "timed in the same rounds (the max_len, sampling, samplers, weights and constrained "
        "studies) by round, others' runs independently; a row keeping fewer than 2 runs is not "
        "judged.",
        f"tokens/s = batch x {N} / one whole `generate` call; step = (that call - the prefill "
        f"call) / {N - 1}, the time per output token of each row (`decodelab/measure/timing.py`).",
        "Roofline: the larger of (parameter bytes + KV-cache bytes of the valid positions) / "
        "bandwidth and FLOPs / matmul rate, averaged over the steps (`decodelab/measure/"
        "roofline.py`); decodelab / roofline = roofline step / measured step. Measured in the "
        f"same run: read bandwidth {value_range([m['bandwidth_gb_s'] for m in metrics], 'GB/s')} "
        f"(a jitted sum over {config['roofline']['bandwidth_mib']} MiB of float32), matmul "
        f"{value_range([m['matmul_gflop_s'] for m in metrics], 'GFLOP/s', 0)} "
        f"({config['roofline']['matmul_n']}^2, float32).",
        "No cache: a jitted forward pass over the whole sequence for each new token, timed at "
        f"{first['nocache_lengths_timed']} sequence lengths from {P} to {P + N - 1} and "
        f"interpolated over the {N} steps; cache speed-up = decodelab tok/s / no-cache tok/s.",
        f"transformers ({versions}): `LlamaForCausalLM.generate` with the same shapes and "
        + ("weights" if all("weights" in m for m in metrics) else
           "weights (rows measured before `weights` was recorded: transformers' own random ones)")
        + f", greedy, `max_new_tokens = min_new_tokens = {N}`, after a {HF_WARMUP_TOKENS}-token "
        f"warm-up call; " + ("both on the GPU (PyTorch on CUDA)" if any(
            m.get("hf_device") == "cuda" for m in metrics) else
            f"{first['threads']} threads for both XLA and PyTorch")
        + " (`decodelab/measure/peers.py`).",
    ]
    if llama_rows(rows):
        extra = "on" if config.get("llama", {}).get("extra_buffers") else "off"
        lines.append("llama.cpp (`llama-cpp-python`): the same GGUF file at batch 1, as stored and "
                     "converted by llama.cpp to float32, the same prompt ids and threads, its "
                     f"extra weight buffers (repacked and AMX kernels) {extra}; MB read per token: "
                     "the weights as each side stores them plus its KV cache at the middle step "
                     "(decodelab float32, llama.cpp float16).")
    sweeps = []
    lengths = speed.metric_rows(rows, "max_len")
    if lengths:
        slots = ", ".join(str(m["max_len"]) for m in lengths)
        sweeps.append(f"Cache size: {speed.label(lengths[0])} in caches of {slots} slots, the "
                      "same live tokens")
    constrained_rows = speed.metric_rows(rows, "constrained")
    if constrained_rows:
        sweeps.append(f"constrained: {constrained_rows[0]['preset']} greedy with EOS banned, "
                      f"free and under the regex `{study_config(rows, 'constrained')['pattern']}` "
                      "(every state accepting), the same rows and prompts")
    if speed.metric_rows(rows, "weights"):
        sweeps.append("weights: the float32 model and its copies stored as "
                      f"{' and '.join(weight_cost.STORAGES)} (`dl.quantize`), greedy, the same "
                      "rows, their repetitions interleaved")
    if speed.metric_rows(rows, "breakdown"):
        sweeps.append("breakdown: the step with one more part removed each time (attention over "
                      "the cache; the rest of the model; the sampling processors and the draw: "
                      "`decodelab/measure/ablation.py`), each part the difference, the loop's "
                      "bookkeeping what is left")
    if sweeps:
        lines.append("; ".join(sweeps) + ".")
    return lines


def breakdown_caveats(rows: Rows) -> list[str]:
    """Where a greedy step's time goes and what sampling costs, from the breakdown rows."""
    metrics = speed.metric_rows(rows, "breakdown")
    parts, costs = [], []
    for m in metrics:
        greedy, sampled = (m.get(f"breakdown_{mode}_full_step_ms") for mode in ("greedy",
                                                                                  "sampled"))
        if greedy:
            largest = max(ablation.PART_LABELS, key=lambda part: m[f"breakdown_greedy_{part}_ms"])
            parts.append(f"{speed.label(m)}: {ablation.PART_LABELS[largest]} "
                         f"({percent(m[f'breakdown_greedy_{largest}_ms'] / greedy)} of "
                         f"{format_number(greedy)} ms)")
        if greedy and sampled:
            costs.append(f"{speed.label(m)} {format_number(sampled - greedy)} ms "
                         f"({percent(1 - greedy / sampled)} of the sampled step)")
    lines = []
    if parts:
        lines.append("Where a greedy step's time goes (the breakdown CSV; differences of medians, "
                     "so a part that costs ~0 can come out slightly negative), the largest part "
                     "per row: " + "; ".join(parts) + ".")
    if costs:
        lines.append("What sampling costs, the sampled step minus the greedy step: "
                     + "; ".join(costs) + ". The ablation splits it less well: the `no_model` "
                     "stand-in's one-hot logits leave top-p a one-token nucleus, so the "
                     "processors' cost on real logits shows in the sampled rows' 'MLP and "
                     "projections'. On random weights the next-token distribution is nearly flat: "
                     "top-p 0.95 keeps thousands of tokens; the pretrained rows sample from real "
                     "distributions.")
    return lines


def caveats(rows: Rows) -> list[str]:
    """What qualifies the numbers: the machine's load, the point estimates, the breakdown."""
    metrics = speed_metrics(rows)
    every = [m for study in ("speed", "max_len", "breakdown", "sampling", "constrained",
                             "weights", "samplers") for m in speed.metric_rows(rows, study)]
    lines = [timing.load_reading(every, other_cores(rows))]
    commits = {}
    for r in rows:
        commits.setdefault(r["config"].get("study", "speed"), set()).add(
            r.get("provenance", {}).get("git_commit", "")[:8])
    if len(set().union(*commits.values())) > 1:
        lines.append("The studies' rows come from more than one commit (a study rerun after a "
                     "change that concerns it keeps the others' rows): " + "; ".join(f"{study} at {', '.join(sorted(found))}"
                                              for study, found in commits.items()) + ".")
    with_nocache = [m for m in metrics if m["cache_speedup"] is not None]
    if with_nocache:
        low = min(with_nocache, key=lambda m: m["cache_speedup"])
        lines.append("The KV-cache claim is judged on point estimates: the no-cache timing keeps "
                     f"no repetitions (lowest {format_number(low['cache_speedup'])}x at "
                     f"{speed.label(low)}, highest "
                     f"{format_number(max(m['cache_speedup'] for m in with_nocache))}x).")
    for m in llama_rows(rows):
        stored, ours = m["llama_bytes_per_token"] / 1e6, m["step_bytes"] / 1e6
        lines.append(f"On the GGUF file's own weights ({format_number(stored)} MB read per token "
                     f"against decodelab's {format_number(ours)}) llama.cpp runs "
                     f"{format_number(m['llama_tokens_per_s'])} tok/s: decodelab "
                     f"({speed.label(m)}) is {format_value(m['speed_vs_llama'])}x its speed.")
    if speed.metric_rows(rows, "weights") and backend(rows) == "cpu":
        lines.append("16-bit weights on XLA CPU: each 16-bit kernel is converted to a float32 "
                     "copy before its dot (`decodelab/model/layers.py`), so they save memory at "
                     "rest, not time; on a GPU or TPU XLA fuses the convert into the dot.")
    lengths = speed.metric_rows(rows, "max_len")
    if len({m["max_len"] for m in lengths}) > 1:
        small, large = (f(lengths, key=lambda m: m["max_len"]) for f in (min, max))
        first = (f"the first call (prefill and cache set-up) takes "
                 f"{format_number(large['prefill_ms'])} ms at max_len {large['max_len']} against "
                 f"{format_number(small['prefill_ms'])} ms at {small['max_len']}")
        if large["prefill_ms"] > 1.1 * small["prefill_ms"]:
            lines.append(f"What capacity still costs: {first}. A prefill attends to its prompt "
                         "only (the model call's `reach`); what grows is allocating and "
                         "zero-filling the cache's max_len slots where no spare cache of the "
                         "layout is kept (`decodelab/cache/spares.py`).")
        else:
            lines.append(f"Capacity costs the first call nothing measurable here: {first}.")
    if speed.metric_rows(rows, "sampling"):
        lines.append("Why top-k and top-p cost most on the smallest presets: each finds its exact "
                     "cut by a bounded search of masked sums over the `[B, V]` logits "
                     "(`decodelab/sampling/select.py`), one `O(V)` pass per step of the search, "
                     "the batch's slowest row setting the number of passes; at vocabulary 4096 a "
                     "tiny or small model's whole step is a few such passes long.")
    lines += breakdown_caveats(rows)
    lines.append("A 20-point sampling sweep compiling the decode loop once is a test, not a "
                 "benchmark row: `tests/test_decode.py` counts the compiles.")
    return lines
