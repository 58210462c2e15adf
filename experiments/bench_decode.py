"""Decode speed: dl.generate against the roofline, the no-cache baseline, transformers, llama.cpp;
what sampling, llama.cpp's samplers, contrastive search and 16-bit weights cost. The commands of
each sweep: ``configs/bench_decode.py``.

One point = one preset (random weights, or a pretrained preset's own) and batch size: exactly
``new_tokens`` per row after ``prompt_len`` random ids. Its metrics: ``decodelab.measure.timing``
(decodelab, no cache, roofline), ``.ablation`` (breakdown), ``.peers`` (``hf_*``, ``llama*``),
``.sampling_cost`` (the sampling and samplers studies), ``.weight_cost`` (the weights study).
Its targets: ``decodelab.report.speed_targets``.
"""

from __future__ import annotations

import os

import numpy as np
from flax import nnx

from decodelab import experiment, report
from decodelab.checks import check_size
from decodelab.experiment import artefacts, presets
from decodelab.measure import (ablation, constrained, peers, roofline, sampling_cost, timing,
                               weight_cost)
from decodelab.model import Transformer
from decodelab.report import speed, speed_tables, speed_targets
from decodelab.sampling.params import SamplingParams

_FLAGS = experiment.define_flags("configs/bench_decode.py")


def benchmark(config, ctx) -> dict:
    """One preset and batch size: every measurement of the module docstring."""
    B, P, N = config.batch_size, config.prompt_len, config.new_tokens
    for name, value, least in (("batch_size", B, 1), ("prompt_len", P, 1), ("new_tokens", N, 2),
                               ("repeats", config.repeats, 1)):
        check_size(f"config.{name}", value, least)
    load, pretrained = os.getloadavg()[0], presets.is_pretrained(config.model)
    model, tokenizer = (artefacts.pretrained_model(config.model) if pretrained else (Transformer(
        presets.build_model_config(config.model, config.vocab_size), rngs=nnx.Rngs(config.seed)),
        None))
    cfg, S = model.config, config.max_len or P + N
    prompts = np.random.default_rng(config.seed).integers(0, cfg.vocab_size, (B, P),
                                                          dtype=np.int32)  # [B, P]
    common = {"preset": config.preset, "study": config.study, "batch_size": B, "max_len": S,
              "params": cfg.num_params(), "threads": timing.threads(), "load_avg_1min": load,
              "vocab_size": cfg.vocab_size, "weights": "pretrained" if pretrained else "random"}
    if config.study == "sampling":  # greedy and each sampling setting, nothing else
        return {**common, **sampling_cost.time_settings(model, prompts, N, config.repeats, S,
                                                        peer=config.peer.enabled)}
    if config.study == "samplers":  # greedy, llama.cpp's samplers and contrastive search
        return {**common, **sampling_cost.time_samplers(model, prompts, N, config.repeats, S)}
    if config.study == "weights":  # float32 weights and each 16-bit storage, nothing else
        return {**common, **weight_cost.time_storages(model, prompts, N, config.repeats, S)}
    if config.study == "constrained":  # a free step and a constrained one, nothing else
        return {**common, **constrained.speed_row(model, tokenizer, "regex", config.pattern,
                                                  prompts, N, config.repeats)}
    ctx.status("roofline probes")
    machine = timing.Machine.measure(config.roofline.bandwidth_mib << 20, config.roofline.matmul_n,
                                     config.roofline.repeats)
    roof_step = machine.roofline_step_s(cfg, B, P, N)
    middle = roofline.step_cost(cfg, B, P + N // 2)  # the middle step's bytes and FLOPs
    ctx.status("decodelab")
    ours = (timing.time_capacity(model, prompts, N, config.repeats, S) if config.study == "max_len"
            else timing.time_generate(model, prompts, N, config.repeats, max_len=S))
    sampled_params = SamplingParams(temperature=config.sampled.temperature,
                                    top_p=config.sampled.top_p)
    modes, sampled, breakdown = {"greedy": SamplingParams(temperature=0.0)}, {}, {}
    if config.sampled.enabled:
        ctx.status("decodelab, sampled")
        timed = timing.time_generate(model, prompts, N, config.repeats, sampled_params, S)
        sampled = {f"sampled_{k}": v for k, v in timed.items()}
        sampled["sampled_vs_greedy"] = timing.ratio(timed["step_ms"], ours["step_ms"] or None)
        modes["sampled"] = sampled_params
    for mode, params in modes.items() if config.breakdown.enabled else ():
        ctx.status(f"breakdown, {mode}")
        breakdown.update(ablation.time_breakdown(model, prompts, N, config.breakdown.repeats,
                                                 params, S, mode))
    nocache = timing.NO_RECOMPUTE
    if config.nocache.enabled:
        ctx.status("no cache")
        nocache = timing.time_recompute(model, prompts, N, config.nocache.lengths,
                                        config.nocache.repeats, config.seed)
    hf = {}
    if config.peer.enabled:
        ctx.status("transformers")
        hf = peers.time_hf_generate(model, prompts, N, config.peer.repeats)
    run_llama = config.llama.enabled and pretrained and B == 1
    llama = peers.llama_cpp_peer(presets.pretrained_path(config.model.pretrained), cfg,
                                 prompts[0], N, config.llama.repeats, machine,
                                 extra_buffers=config.llama.extra_buffers,
                                 status=ctx.status) if run_llama else {}
    return {
        **common, "bandwidth_gb_s": machine.bandwidth / 1e9, "matmul_gflop_s": machine.flops_per_s / 1e9,
        **ours, "roofline_step_ms": 1e3 * roof_step, "roofline_tokens_per_s": B / roof_step,
        "roofline_bound": machine.bound(middle),
        "roofline_ratio": roof_step * 1e3 / ours["step_ms"] if ours["step_ms"] > 0 else None,
        **sampled, **breakdown, **nocache,
        "cache_speedup": timing.ratio(ours["tokens_per_s"], nocache["nocache_tokens_per_s"]),
        **peers.hf_columns(hf, N, config.peer.enabled),
        "speed_vs_hf": timing.ratio(ours["tokens_per_s"], hf.get("hf_tokens_per_s")),
        "step_bytes": middle.bytes, **llama,
        "speed_vs_llama": timing.ratio(ours["tokens_per_s"], llama.get("llama_tokens_per_s")),
        "speed_vs_llama_f32": timing.ratio(ours["tokens_per_s"],
                                           llama.get("llama_f32_tokens_per_s")),
        "llama_version": llama.get("llama_version", "not installed (pip install -e .[llamacpp])"
                                   if run_llama else "not run"),
    }


def forms(rows) -> list[report.Form]:
    groups, backend = speed.target_claims(speed_targets.TARGETS, rows), report.backend(rows)
    on = "" if backend == "cpu" else f" on a {backend.upper()}"
    return [report.Form(
        name="decode_speed" + ("" if backend == "cpu" else f"_{backend}"),
        question=f"How fast does dl.generate decode{on}, against this machine's roofline, the "
                 "no-cache baseline, transformers and llama.cpp?",
        claims=[claim for _, claims in groups for claim in claims],
        answer=lambda judged, rows: speed.answer(groups, judged),
        table=speed_tables.main_table, method=speed_tables.method(rows),
        caveats=speed_tables.caveats(rows), plot=speed_tables.plot,
        plot_caption="output tokens/s against batch size, one line per preset and implementation",
        csvs=speed_tables.csv_tables(rows), command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, benchmark, argv)


if __name__ == "__main__":
    experiment.run_program(main)
