"""Sharded decoding: when tensor parallel pays over 8 chips, and whether every mesh decodes alike.

    python -m experiments.sharding --config=configs/sharding.py --workdir=runs/sharding

A ``plan`` point computes one (chip, model, total batch) from published figures; a ``measure``
point times greedy ``generate`` under one mesh of 8 fake CPU devices. The device count is fixed
when JAX's backend starts, so ``main`` asks for them first (``mesh_timing.fake_cpu_devices``) and
runs every point in that process; importing the module (to render the page) changes nothing.
"""

from __future__ import annotations

import os

import numpy as np

from decodelab import experiment, report
from decodelab.checks import check_int, check_one_of
from decodelab.experiment import presets
from decodelab.experiment.random_model import random_model
from decodelab.measure import mesh_timing
from decodelab.measure import sharding_plan as sp
from decodelab.report import sharding_page as sh
from decodelab.report.form import measured_text

_FLAGS = experiment.define_flags("configs/sharding.py")

DEVICES = 8
LLAMA = "llama3-8b-shape"
H100, V5E = (chip.name for chip in sp.CHIPS)


def smollm2():
    from decodelab.convert import gguf_model_config  # needs the optional gguf package

    return gguf_model_config(presets.pretrained_path("smollm2-135m"))


# The plan's models: `medium` at vocab 4096, SmolLM2-135M as its GGUF file declares it, Llama-3-8B.
PLAN_MODELS = {"medium": lambda: presets.build_model_config(presets.model_section("medium"), 4096),
               "smollm2-135m": smollm2, LLAMA: lambda: sp.LLAMA3_8B}


def evaluate(config, ctx) -> dict:
    check_one_of("part", config.part, ("plan", "measure"))
    if config.part == "plan":
        check_int("batch", config.batch, 1)
        model = PLAN_MODELS[check_one_of("plan_model", config.plan_model, tuple(PLAN_MODELS))]
        return sp.plan_point(model(), sp.chip_named(config.chip), config.batch)
    shape = mesh_timing.mesh_shape(config.mesh)
    for name in ("repeats", "prompts", "prompt_len", "new_tokens"):
        check_int(name, config[name], 1)
    model = random_model(config.model, config.vocab_size, config.seed)
    rng = np.random.default_rng(config.seed)
    prompts = [rng.integers(0, config.vocab_size, config.prompt_len).tolist()
               for _ in range(config.prompts)]
    t = mesh_timing.time_mesh(model, prompts, config.new_tokens, config.repeats, shape)
    return {"first_s": t.first_s, "compile_s": t.compile_s, "rep_s": list(t.rep_s),
            "median_ms": t.median_s * 1e3, "ms_per_token": t.median_s * 1e3 / config.new_tokens,
            "tokens_sha256": t.tokens_sha256, "params_m": model.config.num_params() / 1e6,
            "load_average": os.getloadavg()[0]}


def on_plan(metric: str, chip: str, model: str, batch: int = 1):
    return report.on_row(lambda r: r["metrics"][metric], part="plan", chip=chip,
                         plan_model=model, batch=batch)


CLAIMS = [
    report.Claim("every mesh's greedy tokens equal one device's (share of the meshes)",
                 sh.same_tokens_share, 1.0),
    report.Claim("8 fake CPU devices are no faster than one: the fastest mesh's generate time "
                 "over one device's", sh.fastest_mesh_ratio, 1.0, units="timed calls", unit="x"),
    report.Claim("plan, Llama-3-8B shape on 8 x H100: TP beats DP at every total batch up to",
                 on_plan("break_even_batch", H100, LLAMA), 256),
    report.Claim("plan, Llama-3-8B shape on TPU v5e-8: TP beats DP at every total batch up to",
                 on_plan("break_even_batch", V5E, LLAMA), 256),
    report.Claim("plan, Llama-3-8B shape: a DP replica's GB at B = 1 exceed one TPU v5e chip's "
                 "16 GB", on_plan("dp_gb_per_chip", V5E, LLAMA), sp.CHIPS[1].hbm_bytes / 1e9,
                 unit=" GB"),
    report.Claim("plan, `medium` (27 M parameters) on 8 x H100: break-even batch (0: TP never "
                 "pays)", on_plan("break_even_batch", H100, "medium"), 0, at_least=False),
    report.Claim("plan, `medium` on TPU v5e-8: break-even batch (0: TP never pays)",
                 on_plan("break_even_batch", V5E, "medium"), 0, at_least=False)]


def answer(judged, rows) -> str:
    tokens = ("every mesh gave" if judged[0].met else
              f"only {measured_text(judged[0])} of the meshes gave")
    return (f"On paper TP over 8 chips beats DP for the Llama-3-8B shape below a total batch of "
            f"{measured_text(judged[2])} (H100) and {measured_text(judged[3])} (TPU v5e"
            f"{', where DP does not fit' if judged[4].met else ''}), and never for the 27 M "
            f"`medium` model; on 8 fake CPU devices {tokens} one device's greedy tokens, the "
            f"fastest in {measured_text(judged[1])} one device's time: {report.tally(judged)}.")


def forms(rows) -> list[report.Form]:
    c = sh.reference(rows)["config"] if sh.reference(rows) else {"model": {}}
    return [report.Form(
        name="sharding", claims=CLAIMS, answer=answer, table=sh.main_table,
        question="When does tensor parallel decoding pay over 8 chips, and does every mesh "
                 "decode like one device?",
        plot=lambda rows, path: sh.plan_plot(rows, path, LLAMA),
        plot_caption="plan: µs per layer and decode step of the Llama-3-8B shape, TP and DP "
                     "over 8 chips, against the total batch",
        method=[
            "Plan (computed, nothing measured): per layer and decode step, bf16 weights and "
            "cache, each row attending to 2,048 positions. TP (Megatron, `sharding.PARAM_RULES`)"
            " splits each layer's weights over 8 chips and all-reduces the B x D activations "
            "twice; DP keeps a copy per chip and gives each B / 8 rows.",
            "Time = memory bytes / HBM bandwidth, plus for TP 5 µs per all-reduce and its ring "
            "link bytes (2 (M - 1) / M of the payload) / link bandwidth, from each chip's "
            "published figures (`sharding_plan.CHIPS`, in the plan CSVs with their sources).",
            f"Measured: greedy `generate` of {c.get('prompts')} random prompts x "
            f"{c.get('prompt_len')} tokens, {c.get('new_tokens')} new tokens, on a model of "
            f"{c['model'].get('n_layers')} layers, d {c['model'].get('d_model')}, "
            f"{c['model'].get('n_heads')} heads, random weights, float32; each mesh's first "
            f"call compiles, then {c.get('repeats')} timed calls (median; intervals resample "
            f"them).",
            "The 8 devices are XLA's host platform split into 8 "
            "(`--xla_force_host_platform_device_count=8`, set by the program before JAX starts)."],
        caveats=[
            "The 8 devices are threads of one CPU: the timings show that the partitioned "
            "programs give the same tokens and what partitioning costs on one host, not a "
            f"speed-up; no GPU or TPU was used, so the plan is not checked against a chip. "
            f"{sh.sharing_text(rows)}",
            "The 5 µs all-reduce latency is an assumption (no vendor publishes one number); it "
            "decides the small-model rows.",
            "The plan counts memory and link bytes only (decode is bandwidth-bound); compute, "
            "kernel launch and overlap of communication with compute are left out."],
        csvs={"plan_times": sh.times_table, "plan_bytes": sh.bytes_table,
              "break_even": sh.break_even_table, "tp_layer": sh.tp_layer_table,
              "points": report.points_table},
        command="python -m experiments.report --all")]


def main(argv) -> None:
    mesh_timing.fake_cpu_devices(DEVICES)
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
