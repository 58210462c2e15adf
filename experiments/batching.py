"""Static, dynamic and continuous batching, and chunked prefill, on one slot engine.

    python -m experiments.batching --config=configs/batching.py --workdir=runs/batching

A point replays ``config.replays`` seeded traces (replay r: trace seed ``seed + r``, the same for
every policy) under one policy (``measure.replays.replay_arm``). Its row: replay 0's summary, trace
lengths, ideal static waste and per-request lists; each replay's ``REPLAYED`` values (``replay_*``).
"""

from __future__ import annotations


import decodelab as dl
from decodelab import experiment, report, serving
from decodelab.experiment.random_model import random_model
from decodelab.measure import replays
from decodelab.report import serving_rows as sr
from decodelab.report.form import measured_text

_FLAGS = experiment.define_flags("configs/batching.py")

# The summary values each replay keeps, in replay order (``replay_<name>`` lists of a row).
REPLAYED = ("output_tokens_per_s", "latency_p50_s", "latency_p99_s", "ttft_p99_s", "makespan_s",
            "static_waste_factor")


def make_trace(config, seed: int) -> list[serving.Request]:
    """The point's trace drawn with trace seed ``seed`` (replay r: ``config.seed + r``)."""
    t = config.trace
    params = dl.SamplingParams(temperature=t.temperature, top_p=t.top_p)
    return serving.poisson_trace(t.num_requests, t.rate, t[f"prompt_{t.prompts}"].to_dict(),
                                 t[f"output_{t.output}"].to_dict(), vocab_size=config.vocab_size,
                                 seed=seed, params=params, seed_offset=1000)


def arm(config) -> replays.Arm:
    e = config.engine  # the scheduler's batch is the engine's slots
    return replays.Arm(config.policy, e.num_slots, e.max_len, e.steps_per_call, e.prefill_chunk,
                       max_wait=config.dynamic_max_wait)


def evaluate(config, ctx) -> dict:
    model = random_model(config.model, config.vocab_size, config.seed)
    e, t = config.engine, config.trace
    point = (f"{config.policy} @ {t.rate}/s, {t.prompts} prompts, {t.output}"
             + (f", prefill chunk {e.prefill_chunk}" if e.prefill_chunk else ""))
    runs = replays.replay_arm(
        model, arm(config), lambda r: make_trace(config, config.seed + r), config.replays,
        per_replay=lambda trace: {"static_waste_factor": replays.static_waste_factor(
            [r.max_new_tokens for r in trace], e.num_slots)},
        status=lambda text: ctx.status(f"{point}, {text}"), progress=ctx.show_progress)
    first = runs.first
    return {**first.result.summary, "engine_calls": first.result.steps,
            **replays.trace_lengths(first.trace),
            "static_waste_factor": first.values["static_waste_factor"],
            "replay_wall_s": first.wall_s, "idle_skipped_s": first.result.idle_skipped_s,
            **runs.per_request(), **runs.overall(REPLAYED)}


# --- Claims: at saturation (the largest arrival rate), on the same traces; the page -------------
SHORT, LONG = {"trace.prompts": "short"}, {"trace.prompts": "long"}


def _against_static(output: str, words: str, target: float) -> list[report.Claim]:
    cont, stat = ({**SHORT, "trace.output": output, "policy": p} for p in ("continuous", "static"))
    return [report.Claim(f"{words}: continuous / static output tokens/s",
                         sr.ratio_at_top(cont, stat), target, units="replays", unit="x"),
            *[report.Claim(f"{words}: continuous - static {q} latency",
                           sr.difference_at_top(cont, stat, f"latency_{q}_s"), 0.0,
                           at_least=False, units="requests", unit=" s") for q in ("p50", "p99")]]


def _chunked(chunk: int) -> list[report.Claim]:
    part, whole = {**LONG, "engine.prefill_chunk": chunk}, {**LONG, "engine.prefill_chunk": 0}
    words = f"long prompts, chunks of {chunk}: chunked"
    return [*[report.Claim(f"{words} - whole {what}", sr.difference_at_top(part, whole, metric),
                           0.0, at_least=False, units="requests", unit=" s") for what, metric in
              (("p99 TTFT", "ttft_p99_s"), ("p99 longest gap between tokens", "max_tbt_p99_s"))],
            report.Claim(f"{words} / whole output tokens/s", sr.ratio_at_top(part, whole), 1.0,
                         units="replays", unit="x")]


CLAIMS = [*_against_static("long_tail", "long-tailed outputs", 2.2),
          *_against_static("fixed", "fixed outputs", 1.0), *_chunked(16), *_chunked(64)]
MAIN = {"output tokens/s": "output_tokens_per_s", "p50 latency (s)": "latency_p50_s",
        "p99 latency (s)": "latency_p99_s", "p99 TTFT (s)": "ttft_p99_s",
        "p99 longest gap (s)": "max_tbt_p99_s", "slot occupancy": "slot_occupancy"}
EVERY = ("output_tokens_per_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s",
         "tpot_p50_s", "max_tbt_p99_s", "tbt_p99_s", "slot_occupancy")


def label(row) -> str:
    c = row["config"]
    if c["trace"]["prompts"] == "long":
        chunk = c["engine"]["prefill_chunk"]
        return "long prompts, " + (f"chunks of {chunk}" if chunk else "whole prefill")
    return f"{c['trace']['output']} outputs, {c['policy']}"


def answer(judged, rows) -> str:
    tails = [j for j in judged if j.claim.text.startswith("long prompts") and " - " in j.claim.text]
    return (f"At saturation continuous batching gives {measured_text(judged[0])} static "
            f"batching's output tokens/s on long-tailed outputs (>= 2.2x: {judged[0].verdict}) "
            f"and {measured_text(judged[3])} on fixed ones, and chunked prefill lowers "
            f"{sum(j.met for j in tails)} of the {len(tails)} p99 TTFT and longest-gap tails it "
            f"is judged on: {report.tally(judged)}.")


def forms(rows) -> list[report.Form]:
    e = rows[0]["config"]["engine"]
    static = sr.top(rows, {**SHORT, "trace.output": "long_tail", "policy": "static"})
    ideal = sr.mean_over_replays(static[0]["metrics"], "static_waste_factor") if static else None
    return [report.Form(
        name="batching", claims=CLAIMS, answer=answer,
        question="What do continuous batching and chunked prefill buy over static batching?",
        table=lambda rows: sr.interval_table(sr.top(rows, SHORT) + sr.top(rows, LONG), MAIN, label),
        plot=lambda rows, path: report.line_plot(
            [sr.with_intervals(r, ["output_tokens_per_s"]) for r in rows], path, x="trace.rate",
            y="output_tokens_per_s", group=["policy", "trace.output"], where=SHORT,
            axes=report.Axes(logx=True)),
        plot_caption="output tokens/s against arrival rate, one line per policy and output "
                     "distribution (bars: 95% intervals over replays)",
        method=[
            "One `SlotEngine` (slots, cache length, rounds per call: configs/batching.py) replays "
            "seeded Poisson traces under each policy: static (wait for a full batch, run it to its "
            "end), dynamic (a batch after at most `dynamic_max_wait`), continuous (fill free slots "
            "before every engine call).",
            "Short prompts with fixed or long-tailed (log-normal) outputs; long prompts under "
            "continuous batching, each prefilled whole or in chunks per call (Sarathi-Serve).",
            "The `small` preset with random weights (speed does not depend on their values; no "
            "EOS, each request runs its budget); a sampling seed per request.", *sr.method(rows)],
        caveats=[
            f"Both policies get the same {e['num_slots']} slots: continuous batching only wins "
            "back the slot time full static batches waste, ideally "
            f"{report.format_value(ideal)}x on these long-tailed traces; the published 23x "
            "(vLLM) and 36.9x (Orca) also count paged memory's larger batches (paged.md).",
            "The pooled p99 time between tokens (every gap of every request) has no interval "
            "(tbt_p99_s in the CSVs).", *sr.caveats(rows)],
        csvs={"intervals": lambda rows: sr.interval_table(rows, {m: m for m in EVERY}),
              "points": report.points_table},
        command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
