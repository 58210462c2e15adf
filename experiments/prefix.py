"""Prefix sharing on paged memory: n samples from one prefill, a shared system prompt, hits.

    python -m experiments.prefix --config=configs/prefix.py --workdir=runs/prefix

A point serves its workload (``configs/prefix.py``) ``reps`` times on a fresh engine, each after
an untimed run of the same workload that compiles its programs
(``measure.prefix_sharing.serve``).
"""

from __future__ import annotations

import numpy as np

import decodelab as dl
from decodelab import experiment, report, serving
from decodelab.checks import check_int
from decodelab.experiment.random_model import random_model
from decodelab.measure import prefix_sharing as ps
from decodelab.report import prefix as pr
from decodelab.report.form import measured_text

_FLAGS = experiment.define_flags("configs/prefix.py")

WORKLOADS = ("trace", "passk", "hit")
PARAMS = dl.SamplingParams(temperature=0.8)


def _check(config) -> None:
    if config.workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {config.workload!r}")
    for name in ("reps", "n", "question", "output", "num_requests", "num_slots", "page_size",
                 "steps_per_call"):
        check_int(name, config[name], 1)
    if config.system + config.question + config.output > config.max_len:
        raise ValueError(f"max_len must hold system + question + output = "
                         f"{config.system + config.question + config.output}, got "
                         f"{config.max_len}")


def workload(config, question_seed: int = 0) -> list[serving.Request]:
    """The point's requests: the trace's, or one prompt's n samples (one request of n with
    sharing, n requests without); ``question_seed`` varies the questions, not the system
    prompt."""
    count, n = {"trace": (config.num_requests, 1), "hit": (1, 1)}.get(
        config.workload, (1, config.n) if config.sharing else (config.n, 1))
    requests = ps.shared_prompt_requests(count, config.system, config.question, config.output,
                                         vocab_size=config.vocab_size, seed=config.seed,
                                         params=PARAMS, n=n)
    if question_seed:  # same system prompt, other questions
        other = ps.shared_prompt_requests(count, 0, config.question, config.output,
                                          vocab_size=config.vocab_size,
                                          seed=config.seed + question_seed, params=PARAMS, n=n)
        requests = [serving.Request(id=r.id + 1000, prompt=r.prompt[:config.system] + o.prompt,
                                    max_new_tokens=r.max_new_tokens, params=PARAMS, seed=r.seed,
                                    n=n) for r, o in zip(requests, other)]
    if config.workload == "passk" and not config.sharing:  # one prompt, n separate requests
        requests = [serving.Request(id=i, prompt=requests[0].prompt, max_new_tokens=r.
                                    max_new_tokens, params=PARAMS, seed=r.seed)
                    for i, r in enumerate(requests)]
    return requests


def evaluate(config, ctx) -> dict:
    _check(config)
    model = random_model(config.model, config.vocab_size, config.seed)
    memory = config.num_slots * config.max_len  # every sample's whole length fits: no preemption

    def engine():
        return serving.SlotEngine(model, config.num_slots, config.max_len, kv_tokens=memory,
                                  page_size=config.page_size, prefix_cache=config.sharing
                                  or config.workload == "hit")

    def once(fresh):
        if config.workload == "hit":  # a miss, then on the same engine a hit
            miss = ps.serve(fresh, workload(config), steps_per_call=config.steps_per_call)
            hit = ps.serve(fresh, workload(config, 1), steps_per_call=config.steps_per_call)
            return {f"{k}_{name}": v for k, run in (("miss", miss), ("hit", hit))
                    for name, v in run.items()}
        return ps.serve(fresh, workload(config), steps_per_call=config.steps_per_call)

    once(engine())  # compiles
    runs = []
    for rep in range(config.reps):
        ctx.status(f"{config.workload}, n {config.n}, sharing {config.sharing}, rep {rep + 1}")
        runs.append(once(engine()))
    if config.workload == "hit":
        return {"miss_ttft_s": [r["miss_ttft_s"][0] for r in runs],
                "hit_ttft_s": [r["hit_ttft_s"][0] for r in runs],
                **{k: runs[0][k] for k in ("miss_prefill_tokens", "hit_prefill_tokens",
                                           "hit_peak_pages", "hit_preemptions")}}
    return {**{k: runs[0][k] for k in ("prefill_tokens", "peak_pages", "preemptions",
                                       "output_tokens")},
            "rep_ttft_s": [float(np.mean(r["ttft_s"])) for r in runs],
            "rep_all_first_s": [max(r["ttft_s"]) for r in runs],
            "rep_output_tokens_per_s": [r["output_tokens_per_s"] for r in runs]}


CLAIMS = [
    report.Claim("n = 8: prefill tokens computed, one request of 8 samples / 8 requests",
                 pr.prefill_ratio(8), 0.3, at_least=False, unit="x"),
    report.Claim("n = 8: seconds until every sample's first token, shared / separate",
                 pr.prefill_ratio(8, "rep_all_first_s"), 0.3, at_least=False, units="reps",
                 unit="x"),
    report.Claim("time to first token, system-prompt hit / miss", pr.hit_over_miss, 0.3,
                 at_least=False, units="reps", unit="x"),
    report.Claim("roofline (GPU config): prefill seconds of the trace, shared / separate",
                 pr.gpu_prefill_ratio, 0.3, at_least=False, unit="x")]


def answer(judged, rows) -> str:
    return (f"Eight samples from one prefill computed {measured_text(judged[0])} the prefill "
            f"tokens of eight requests and reached every first token in "
            f"{measured_text(judged[1])} the time; a system-prompt hit took "
            f"{measured_text(judged[2])} a miss's time to first token: {report.tally(judged)}.")


def forms(rows) -> list[report.Form]:
    config = rows[0]["config"] if rows else {"gpu": {}, "steps_per_call": 1}
    g = config["gpu"]  # the stated GPU of the roofline
    return [report.Form(
        name="prefix", claims=CLAIMS, answer=answer, table=pr.main_table,
        question="What do shared prompt pages save: prefill, time to first token, memory?",
        plot=lambda rows, path: report.line_plot(
            [r for r in rows if r["config"]["workload"] == "passk"], path, x="n",
            y="peak_pages", group="sharing", axes=report.Axes(logx=True)),
        plot_caption="peak pool pages against n samples of one prompt, shared or separate",
        method=[
            "The paged engine with the prefix cache and samples in one `Request(n=)` (shared) or "
            "neither (separate); a pool big enough that nothing is preempted. The `small` "
            "preset, random weights, no EOS.",
            "trace: requests arriving together, one shared system prompt and a question each "
            "(the first prefills the prefix, the others wait a call and share it); passk: one "
            "prompt drawn n times; hit: a request on a fresh engine, then one sharing its "
            "system prompt. Prefill tokens are counted; seconds are means over fresh-engine reps;"
            f" {config['steps_per_call']} decode round(s) per engine call.",
            f"Roofline: prefill at 2 FLOPs per parameter per token on the stated GPU config "
            f"({g.get('name')}: {g.get('flops', 0) / 1e12:g} TFLOP/s, "
            f"{g.get('bandwidth', 0) / 1e12:g} TB/s, {g.get('params', 0) / 1e9:g}B parameters, "
            f"{g.get('requests')} requests)."],
        caveats=["CPU timings of a small model: a call's fixed cost weighs more than on a GPU; "
                 "waiting samples prefill a call after their leader."],
        csvs={"points": report.points_table}, command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
