"""The quantization pages' tables, plot, method and caveats, from one reference model's rows
(``compression.page_rows``): weight rows crossed with KV caches, the self-draft row and, for a
pretrained model, the llama.cpp rows (``decodelab.measure.compression``)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from decodelab.report.compression import (cell, find, metric, model_text, point, speed_cell,
                                          times)
from decodelab.report.tables import Table, format_number

Rows = Sequence[Mapping[str, Any]]

# Published anchors (not rerun here): llama.cpp's `llama-perplexity --kl-divergence` on
# LLaMA-3-8B against FP16, (mean KLD, same top %) per scheme; the AWQ paper's LLaMA-7B wikitext-2
# perplexity per int4 g128 method.
LLAMA_CPP_ANCHORS = {"q8_0": (0.00136, 97.67), "q4_K_M": (0.0313, 91.90), "q4_0": (0.0719, None),
                     "KV cache q8_0": (0.00098, None)}
AWQ_PAPER_PPL = {"FP16": 5.68, "round to nearest": 5.96, "GPTQ": 6.22, "AWQ": 5.78}
# Our row -> the anchor it is set against: (label, KV cache, anchor, what the anchor is).
ANCHOR_PAIRS = (("int8", "f32", "q8_0", "q8_0 (blocks of 32)"),
                ("int4 g32", "f32", "q4_0", "q4_0 (int4 absmax in blocks of 32: the same scheme)"),
                ("f32", "int8", "KV cache q8_0", "a q8_0 KV cache"))


def candidate(label: str, kv: str = "f32") -> dict:
    """``where`` of the weight row ``label`` read through a ``kv`` cache."""
    return {"label": label, "kv_cache": kv}


def larger_group(method: str):
    """``where`` of the int4 absmax row of ``method`` at the larger group size (128, or 64 where
    the width is no multiple of 128), float32 KV cache."""
    def chosen(row: Mapping[str, Any]) -> bool:
        c = row["config"]
        return (c.get("weights") == "int4" and c.get("method") == method and c.get("group_size")
                not in (0, 32) and c.get("scheme") == "absmax" and c.get("kv_cache") == "f32"
                and not c.get("self_draft") and not c.get("peer"))

    return chosen


def kv_of(row: Mapping[str, Any]) -> str:
    c = row["config"]
    return "f16 (llama.cpp)" if c.get("peer") else "f32" if c["self_draft"] else c["kv_cache"]


def megabytes(n: float | None) -> float | None:
    return None if n is None else n / 1e6


def main_table(rows: Rows) -> Table:
    """Per candidate: its bytes, the scoreboard's two figures and the speed-ups."""
    return Table(["weights", "KV cache", "param MB", "mean KLD", "same top %", "speed-up b1",
                  "speed-up b8"],
                 [[metric(r, "label"), kv_of(r), megabytes(metric(r, "parameter_bytes")),
                   cell(r, "kl_mean"), cell(r, "same_top"), speed_cell(r, 1), speed_cell(r, 8)]
                  for r in rows])


def scoreboard_table(rows: Rows) -> Table:
    """Every figure of every row."""
    columns = ["weights", "KV cache", "param MB", "KV bytes/token", "mean KLD", "p99 KLD",
               "same top %", "RMS dp", "ppl", "ppl diff", "tok/s b1", "speed-up b1", "tok/s b8",
               "speed-up b8", "alpha"]
    return Table(columns, [[metric(r, "label"), kv_of(r), megabytes(metric(r, "parameter_bytes")),
                            metric(r, "kv_bytes_per_token"), cell(r, "kl_mean"),
                            metric(r, "kl_p99"), cell(r, "same_top"), metric(r, "rms_top_prob"),
                            metric(r, "perplexity_candidate"), metric(r, "perplexity_diff"),
                            metric(r, "tokens_per_s_b1"), speed_cell(r, 1),
                            metric(r, "tokens_per_s_b8"), speed_cell(r, 8), metric(r, "alpha")]
                           for r in rows])


def plot(rows: Rows, path: pathlib.Path) -> pathlib.Path:
    """Mean KL divergence against parameter bytes, one marker per KV cache kind."""
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for kv, marker in (("f32", "o"), ("int8", "s"), ("int4", "^")):
        group = [r for r in rows if not r["config"]["self_draft"] and not r["config"].get("peer")
                 and r["config"]["kv_cache"] == kv]
        ax.scatter([metric(r, "parameter_bytes") / 1e6 for r in group],
                   [max(metric(r, "kl_mean"), 1e-7) for r in group], marker=marker,
                   label=f"KV cache {kv}")
        for r in group if kv == "f32" else ():
            ax.annotate(metric(r, "label"), (metric(r, "parameter_bytes") / 1e6,
                                             max(metric(r, "kl_mean"), 1e-7)), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("parameter MB (int4 at half a byte)")
    ax.set_ylabel("mean KL(ref || candidate), nats")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def question(rows: Rows) -> str:
    return (f"How close do int8 and int4 weights and KV caches keep "
            f"{model_text(rows[0]['config'])} to its float32 next-token distributions, and how "
            "fast do they decode?")


def method(rows: Rows) -> list[str]:
    """How each number is made, in at most 8 lines."""
    c = rows[0]["config"]
    lines = [
        f"Reference: {model_text(c)}. Candidates: weights stored int8 (one scale per output "
        "channel, or per block of 32 inputs: g32) or int4 in groups (absmax or min-max round to "
        f"nearest; GPTQ and AWQ calibrated on {c['calibration_windows']} training windows of "
        f"{c['window_tokens']} tokens), each read through a float32, int8 or int4 KV cache; "
        "W8A8 also rounds each token's input to a projection to int8 with a scale per weight "
        "group (the whole input for one scale per channel), W8A8x2 that rounding's remainder "
        "too (two int8 terms of one integer dot).",
        "Scoreboard (`dl.compare`, llama.cpp's `--kl-divergence` table): KL(reference || "
        f"candidate) at every position of {c['num_windows']} evenly spaced windows of "
        f"{c['window_tokens']} held-out tokens, mean and p99 in nats; same top %; perplexities; "
        "parameter bytes at each element's width.",
        f"Decode speed: greedy `dl.generate` of {c['new_tokens']} tokens after "
        f"{c['prompt_tokens']}-token prompts at batch 1 and 8, medians of {c['repeats']} runs "
        "interleaved with the float32 reference after a warm-up (compilation excluded); "
        "speed-up = reference seconds / candidate seconds.",
        "Brackets: 95% bootstrap intervals over the windows (scoreboard; GPTQ and AWQ against "
        "round to nearest paired window by window) and over the timed runs, paired run by run "
        "(speed-ups); a row keeping no per-window or per-run values is judged on its point value.",
        "On CPU, XLA fuses no dequantization into a dot, so a quantized kernel is dequantized in "
        "blocks of at most 2^17 weights (512 KiB of float32) inside a loop "
        "(`decodelab/compress/qlinear.py`) and a block stays in cache; int4 enters the loop as "
        "an int8 copy. W8A8 multiplies int8 by int8 into int32 on XLA's integer GEMM, as "
        "llama.cpp's quantized dots do; batch 1 pads its row to two (XLA's one-row integer dot "
        "is slow); in blocks of 32, its rounded inputs go through that blocked float matmul "
        "(XLA's dot batched over the blocks is slower).",
        f"Self-draft row: `speculative_generate` of the reference drafting with its own int4 g32 "
        f"copy (greedy, gamma {c['gamma']}); alpha = accepted / tested proposals.",
    ]
    if any(r["config"].get("peer") for r in rows):
        lines.append("llama.cpp rows (`llama-cpp-python`): llama.cpp's logits on the same windows "
                     "from the GGUF file as stored and from its own float32, Q8_0, Q4_0 and "
                     "Q4_K_M conversions (its quantizer run on the float32 copy), scored against "
                     "decodelab's float32 reference, and its greedy decode of the same tokens at "
                     "batch 1 (medians of as many runs); its KV cache is float16; param MB: the "
                     "file's tensor bytes.")
    return lines


def anchor_lines(rows: Rows) -> list[str]:
    """This model's rows beside the published anchors (``LLAMA_CPP_ANCHORS``,
    ``AWQ_PAPER_PPL``)."""
    parts = []
    for label, kv, anchor, what in ANCHOR_PAIRS:
        row = find(rows, candidate(label, kv))
        if row is not None:
            ours, value = metric(row, "kl_mean"), LLAMA_CPP_ANCHORS[anchor][0]
            parts.append(f"{label if kv == 'f32' else 'an int8 KV cache'} "
                         f"{format_number(ours)} against {value} for {what} "
                         f"({format_number(ours / value)}x)")
    minmax = find(rows, candidate("int4 g32 min-max"))
    if minmax is not None:
        parts.append(f"int4 g32 min-max {format_number(metric(minmax, 'kl_mean'))}")
    lines = []
    measured = any(r["config"].get("peer", "").startswith("llama.cpp-q") for r in rows)
    if parts and not measured:  # llama.cpp's own quantizations of this model, where measured
        lines.append("Mean KLD against llama.cpp's published LLaMA-3-8B figures (against FP16, "
                     "not rerun here): " + "; ".join(parts) + ". Its other anchors: q8_0 same "
                     "top 97.67%; q4_K_M mean KLD 0.0313, same top 91.90%.")
    found = {name: find(rows, larger_group(method)) for name, method in (
        ("round to nearest", "rtn"), ("GPTQ", "gptq"), ("AWQ", "awq"))}
    if None not in found.values():
        ours = sorted((metric(row, "perplexity_diff"), name) for name, row in found.items())
        paper = sorted((AWQ_PAPER_PPL[name] - AWQ_PAPER_PPL["FP16"], name) for name in found)
        lines.append("int4 at the larger group size, perplexity added over the reference: "
                     + ", ".join(f"{name} {value:+.3g}" for value, name in ours)
                     + f" (AWQ paper, LLaMA-7B, wikitext-2 from FP16 {AWQ_PAPER_PPL['FP16']}: "
                     + ", ".join(f"{name} {value:+.2f}" for value, name in paper)
                     + "); differences of this size are what the windows' noise moves a "
                     "perplexity by, so the verdict table compares the methods by mean KLD, "
                     "token by token.")
    return lines


def peer_lines(rows: Rows) -> list[str]:
    """What each llama.cpp row measured (or why it was not run)."""
    lines = []
    for r in rows:
        if not r["config"].get("peer"):
            continue
        if metric(r, "note"):
            lines.append(f"{metric(r, 'label')}: {metric(r, 'note')}.")
            continue
        speed = metric(r, "tokens_per_s_b1")
        lines.append(f"{metric(r, 'label')} on the same windows: mean KLD "
                     f"{format_number(point(cell(r, 'kl_mean')))} from decodelab's float32 "
                     f"reference, same top {format_number(point(cell(r, 'same_top')))}%, "
                     f"perplexity {metric(r, 'perplexity_candidate'):.3f} against "
                     f"{metric(r, 'perplexity_reference'):.3f}"
                     + ("" if speed is None else f"; {format_number(speed)} tok/s at batch 1")
                     + ".")
    return lines


def caveats(rows: Rows) -> list[str]:
    """The anchors, the llama.cpp rows, why a small model differs, and the intervals' limits."""
    lines = anchor_lines(rows) + peer_lines(rows)
    w8a8 = find(rows, candidate("int8 W8A8"))
    if w8a8 is not None and speed_cell(w8a8, 8) is not None:
        lines.append(f"W8A8 at batch 8: {times(speed_cell(w8a8, 8))} the reference's speed.")
    lines.append("A small model (27M or 135M parameters) spreads each layer's function over fewer "
                 "weights than an 8B one, so one weight's rounding moves its output more and the "
                 "same scheme's KL divergence is larger; the vocabulary (4k trained, 49k SmolLM2) "
                 "and the text scored differ from the anchors' too.")
    if rows[0]["config"]["model"].get("pretrained"):
        lines.append("This reference is itself its Q4_1 file dequantized: its weights already sit "
                     "on a grid of 16 levels per block of 32 inputs (a float scale and minimum "
                     "each), so int4 rounds them a second time. Min-max int4 g32 spans each "
                     "block's range but rounds its zero point to an integer (qwix's), shifting "
                     "its grid from the file's by up to half a level; absmax int4 wastes part of "
                     "its 16 levels on a side the block does not reach. llama.cpp reading the "
                     "same file rounds only the activations (to 8 bits, for its integer dots).")
    lines.append("The intervals are over the scored windows; windows of one text are not "
                 "independent, so they are if anything too narrow.")
    return lines
