"""Quantization: weights stored as int8 / int4 and KV caches stored as int8 / int4, judged by KL
divergence to the float32 model (llama.cpp's scoreboard) and by decode speed.

    python -m experiments.quantization --config=configs/quantization.py --workdir=runs/quantization
    python -m experiments.report --workdir=runs/quantization --out=results

One point = one (weights, group size, scheme, method, KV cache), or the self-draft row. What each
number is:

- the scoreboard (``dl.compare``) of the candidate (quantized weights, read through a KV cache of
  the point's kind) against the float32 reference with a float32 cache, on ``num_windows`` evenly
  spaced windows of ``window_tokens + 1`` test-play tokens: ``kl_mean``, ``kl_p99`` (nats),
  ``same_top`` (%), ``rms_top_prob``, both perplexities; ``parameter_bytes`` at each element's bit
  width; ``kv_bytes_per_token``.
- ``tokens_per_s_b<B>``: greedy ``dl.generate`` of ``new_tokens`` tokens for B prompts with the
  candidate and its cache, output tokens / median seconds; ``speedup_b<B>``: the reference's
  median seconds on the same prompts over the candidate's, runs interleaved after a warm-up
  (compilation excluded). ``reference_reps_s_b<B>`` and ``reps_s_b<B>``: each run's seconds, in
  run order (run i of the two programs back to back), for the speed-up's bootstrap interval.
- The self-draft row: ``speculative_generate`` of the reference drafting with its own int4 g32 copy
  (greedy, ``gamma``): ``alpha`` (accepted / tested proposals) and ``speedup_b1`` over the
  reference's ``dl.generate`` (with its runs' seconds, as above).
- The llama.cpp rows (a pretrained model, ``peer``): the scoreboard of llama.cpp's logits
  (``llama-cpp-python``, the ``llamacpp`` extra) on the same windows, read from the model's GGUF
  file as stored or from llama.cpp's own float32 copy of it, against decodelab's float32
  reference: a cross-implementation check on the same weights. ``parameter_bytes``: the file's
  tensor bytes. llama.cpp keeps its KV cache in float16. Without the extra, the row says so.
- ``*_per_window``: the scoreboard's per-window values (``dl.compare``), for a bootstrap over
  windows.
- ``load_1min``: the machine's 1-minute load average when the point started.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
from absl import app
from matplotlib.figure import Figure

import decodelab as dl
from decodelab import experiment, optional
from decodelab import report as results
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets
from decodelab.measure import stats
from decodelab.text.data import token_windows
from experiments import llama_peer
from experiments.scoreboard import (cached, cell, judged, reference_key, speed_cell, speed_judged,
                                    swap_candidate, time_decoding, timed_pair, times)

_FLAGS = experiment.define_flags("configs/quantization.py")

# config.peer -> the row's label.
PEERS = {"llama.cpp": "llama.cpp (GGUF as stored)", "llama.cpp-f32": "llama.cpp (its float32 copy)"}

ANCHORS = """**Published anchors** (not rerun here). llama.cpp, LLaMA-3-8B against FP16
(`llama-perplexity --kl-divergence`): q8_0 mean KLD 0.00136, same top token 97.67%; q4_K_M
0.0313 / 91.90%; q4_0 0.0719; KV cache q8_0 (K and V) mean KLD 0.00098. AWQ paper, LLaMA-7B,
wikitext-2 perplexity: FP16 5.68, int4 g128 round-to-nearest 5.96, GPTQ 6.22, AWQ 5.78."""


MATMUL = """**How the quantized matmul runs on CPU.** XLA on CPU fuses no dequantization into a
dot: the dot reads float32 operands, so dequantizing a whole kernel and multiplying writes and
reads a float32 copy of every weight, and XLA keeps all of a decode step's copies alive at once.
Applying the scales to the dot's output, or an int8 x float32 `dot_general`, compiles to the same
convert-then-dot; a multiply-and-reduce fusion that never forms the kernel is slower than the
float32 dot. `decodelab/qlinear.py` therefore dequantizes blocks of at most 2^17 weights (512
KiB of float32) inside a loop, so a block stays in cache (`tests/test_quantize.py` checks the
compiled step forms no larger float buffer from integer weights). int4 gains less: XLA on CPU
converts an int4 array entering a loop to an int8 copy, and its int4 -> float32 convert costs
more than int8's. The one formulation that reads the int8 weights as they are is an integer dot:
the W8A8 row (`dl.quantize(..., activations="int8")`) rounds each token's input to int8 with its
own scale and multiplies int8 by int8 into int32 on XLA's integer GEMM, as llama.cpp does for its
quantized dot products; it adds the activations' rounding to the weights', so it is scored as a
scheme of its own. XLA on CPU runs a one-row integer dot on a slow path, so batch 1 pads its row
to two. The speed-up columns above are this page's measurement of the result."""


READING = """Why a small model can differ: a model of 135M (or 27M) parameters spreads each
layer's function over fewer weights, so one weight's rounding error moves the output more than in
an 8B model, and the KL divergence of the same scheme is larger; the vocabulary (49k for SmolLM2,
4k for the trained model) and the text scored differ from the anchors' too. SmolLM2's reference is
itself its Q4_1 file dequantized, so its weights already sit on a grid of 16 levels per block of
32 inputs (a float scale and minimum each). Re-quantizing them to int4 adds a second rounding of
the same size as the first: min-max int4 in groups of 32 spans each block's range but rounds its
zero point to an integer (qwix's), so its grid is shifted from the file's by up to half a level;
absmax int4 spans a symmetric range and wastes part of its 16 levels on a side the block does not
reach. llama.cpp reading the same file (its Q4_1 row) rounds only the activations (to 8 bits,
for its integer dot products). Intervals are over the scored windows (95% bootstrap); windows of
one text are not independent, so they are if anything too narrow."""


def _label(config) -> str:
    if config.self_draft:
        return "self-draft (int4 g32)"
    if config.weights == "f32":
        return "f32"
    group = f" g{config.group_size}" if config.group_size else ""
    extra = {"rtn": "" if config.scheme == "absmax" else " min-max", "gptq": " GPTQ",
             "awq": " AWQ"}[config.method]
    activations = " W8A8" if config.activations == "int8" else ""
    return f"{config.weights}{group}{extra}{activations}"


def _check_peer(config) -> None:
    if config.peer and config.peer not in PEERS:
        raise ValueError(f"config.peer must be '' or one of {sorted(PEERS)}, got "
                         f"{config.peer!r}")
    if config.peer and not presets.is_pretrained(config.model):
        raise ValueError(f"config.peer={config.peer!r} needs a pretrained model's GGUF file, "
                         f"got the architecture {dict(config.model)}")


def _peer_scoreboard(config, model, tokenizer, ctx) -> dict:
    """The scoreboard of llama.cpp's logits (module docstring) against ``model``."""
    try:
        optional.require("llama_cpp")
    except optional.MissingExtra:
        return {"note": "not run: llama-cpp-python is not installed (pip install -e .[llamacpp])"}
    source = presets.pretrained_path(config.model.pretrained)
    windows = token_windows(tokenizer, "test", config.num_windows, config.window_tokens + 1)
    ctx.status(config.peer)
    with tempfile.TemporaryDirectory() as scratch:
        path = (source if config.peer == "llama.cpp"
                else llama_peer.float32_copy(source, pathlib.Path(scratch) / "f32.gguf"))
        board = dl.compare(model, lambda batch: llama_peer.logits(path, np.asarray(batch)),
                           windows)
        file_bytes = llama_peer.gguf_tensor_bytes(path)
    return {**board.as_dict(), "parameter_bytes": file_bytes,
            "llama_version": optional.require("llama_cpp").__version__}


def evaluate(config, ctx) -> dict:
    load = os.getloadavg()[0]
    _check_peer(config)
    model, tokenizer = cached(reference_key(config), lambda: pipeline.model_for(
        config.tokenizer, config.model, config.train, ctx.workdir, progress=ctx.show_progress))
    kv = None if config.kv_cache == "f32" else config.kv_cache
    greedy = dl.SamplingParams.greedy()
    prompts = token_windows(tokenizer, "test", max(config.batch_sizes),
                            config.prompt_tokens).tolist()
    N = config.new_tokens
    if config.peer:
        return {"label": PEERS.get(config.peer), "load_1min": load,
                **_peer_scoreboard(config, model, tokenizer, ctx)}
    row = {"label": _label(config), "load_1min": load}
    if config.self_draft:
        ctx.status("self-draft")
        draft = dl.quantize(model, weights="int4", group_size=32)
        outputs = []

        def run_spec():
            outputs.append(dl.speculative_generate(model, draft, prompts[:1], greedy,
                                                   config.gamma, N, seed=config.seed))
            return outputs[-1].tokens

        timed = timed_pair(lambda: dl.generate(model, prompts[:1], greedy, N).tokens,
                            run_spec, config.repeats, 1)
        return {**row, "alpha": outputs[0].stats.overall_alpha,
                "tokens_per_s_b1": N / timed.pop("_median_s"), **timed,
                "parameter_bytes": dl.parameter_bytes(model),
                "draft_parameter_bytes": dl.parameter_bytes(draft)}
    ctx.status("quantize")
    if config.weights == "f32":
        candidate = model
    else:
        calibration = (token_windows(tokenizer, "train", config.calibration_windows,
                                config.window_tokens) if config.method != "rtn" else None)
        key = (config.weights, config.group_size, config.scheme, config.method,
               config.activations)
        candidate = swap_candidate(key, lambda: dl.quantize(
            model, weights=config.weights, group_size=config.group_size or None,
            method=config.method, calibration=calibration, scheme=config.scheme,
            activations=config.activations or None))
    ctx.status("scoreboard")
    windows = token_windows(tokenizer, "test", config.num_windows, config.window_tokens + 1)
    board = dl.compare(model, candidate, windows, candidate_kv_cache=kv)
    row.update({k: v for k, v in board.as_dict().items()})
    row["parameter_bytes"] = board.parameter_bytes_candidate
    row["kv_bytes_per_token"] = board.kv_bytes_per_token_candidate
    row.update(time_decoding(model, candidate, prompts, config, ctx, kv_cache=kv))
    return row


# --- The page -------------------------------------------------------------------------------------


def _m(row, name):
    return row["metrics"].get(name)


def _pretrained(row) -> str | None:
    return row["config"]["model"].get("pretrained")


def _table(rows) -> results.Table:
    columns = ["weights", "KV cache", "param MB", "KV bytes/token", "mean KLD", "p99 KLD",
               "same top %", "RMS dp", "ppl", "ppl diff", "tok/s b1", "speed-up b1", "tok/s b8",
               "speed-up b8", "alpha"]
    body = []
    for r in rows:
        kv = ("f16 (llama.cpp)" if r["config"].get("peer") else
              "f32" if r["config"]["self_draft"] else r["config"]["kv_cache"])
        bytes_ = _m(r, "parameter_bytes")
        body.append([_m(r, "label"), kv, None if bytes_ is None else bytes_ / 1e6,
                     _m(r, "kv_bytes_per_token"), cell(r, "kl_mean"), _m(r, "kl_p99"),
                     cell(r, "same_top"), _m(r, "rms_top_prob"), _m(r, "perplexity_candidate"),
                     _m(r, "perplexity_diff"), _m(r, "tokens_per_s_b1"), speed_cell(r, 1),
                     _m(r, "tokens_per_s_b8"), speed_cell(r, 8), _m(r, "alpha")])
    return results.Table(columns, body)


def _plot(rows, path: pathlib.Path) -> pathlib.Path:
    """Mean KL divergence against parameter bytes, one marker per KV cache kind."""
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for kv, marker in (("f32", "o"), ("int8", "s"), ("int4", "^")):
        group = [r for r in rows if not r["config"]["self_draft"] and not r["config"].get("peer")
                 and r["config"]["kv_cache"] == kv]
        ax.scatter([_m(r, "parameter_bytes") / 1e6 for r in group],
                   [max(_m(r, "kl_mean"), 1e-7) for r in group], marker=marker,
                   label=f"KV cache {kv}")
        for r in group:
            if kv == "f32":
                ax.annotate(_m(r, "label"), (_m(r, "parameter_bytes") / 1e6,
                                             max(_m(r, "kl_mean"), 1e-7)), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("parameter MB (int4 at half a byte)")
    ax.set_ylabel("mean KL(ref || candidate), nats")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _find(rows, label: str, kv: str = "f32"):
    return next((r for r in rows if _m(r, "label") == label and not r["config"]["self_draft"]
                 and not r["config"].get("peer") and r["config"]["kv_cache"] == kv), None)


def _targets(rows, pretrained: str | None) -> str:
    """The issue's targets, read from the rows; scoreboard targets judged by the bootstrap
    interval over windows (95%), speed targets by the interval over timed runs (on the medians
    alone for rows that keep no runs' seconds)."""
    def peer_line(r):
        if _m(r, "note"):
            return f"- {_m(r, 'label')}: {_m(r, 'note')}."
        return (f"- {_m(r, 'label')} on the same windows: mean KLD {cell(r, 'kl_mean'):.2g} "
                f"from decodelab's float32 reference, same top {cell(r, 'same_top'):.4g}%, "
                f"perplexity {_m(r, 'perplexity_candidate'):.3f} vs "
                f"{_m(r, 'perplexity_reference'):.3f}.")

    lines = []
    int8 = _find(rows, "int8")
    if int8:
        lines.append(f"- int8 weights: mean KLD {cell(int8, 'kl_mean'):.2g} (target <= 0.002: "
                     f"{judged(int8, 'kl_mean', 0.002, True)}), same top "
                     f"{cell(int8, 'same_top'):.4g}% (target >= 97%: "
                     f"{judged(int8, 'same_top', 97, False)}); speed-up at batch 1 "
                     f"{times(speed_cell(int8, 1))} (target >= 1.5x: {speed_judged(int8, 1.5)}).")
    w8a8 = _find(rows, "int8 W8A8")
    if w8a8:
        lines.append(f"- int8 weights with int8 activations (W8A8, the integer dot): mean KLD "
                     f"{cell(w8a8, 'kl_mean'):.2g} (<= 0.002: "
                     f"{judged(w8a8, 'kl_mean', 0.002, True)}), same top "
                     f"{cell(w8a8, 'same_top'):.4g}% (>= 97%: "
                     f"{judged(w8a8, 'same_top', 97, False)}); speed-up at batch 1 "
                     f"{times(speed_cell(w8a8, 1))} (>= 1.5x: {speed_judged(w8a8, 1.5)}), at batch "
                     f"8 {times(speed_cell(w8a8, 8))}.")
    kv8 = _find(rows, "f32", "int8")
    if kv8:
        lines.append(f"- int8 KV cache: mean KLD {cell(kv8, 'kl_mean'):.2g} (target <= 0.002: "
                     f"{judged(kv8, 'kl_mean', 0.002, True)}).")
    g32 = _find(rows, "int4 g32")
    if g32 and pretrained:
        lines.append(f"- int4 g32 weights: same top {cell(g32, 'same_top'):.4g}% (target >= 90% "
                     f"on SmolLM2: {judged(g32, 'same_top', 90, False)}).")
    lines += [peer_line(r) for r in rows if r["config"].get("peer")]
    return "\n".join(lines)


def _methods_by_kl(rows) -> str:
    """GPTQ and AWQ against round to nearest (int4 at the larger group size, float32 KV cache) by
    mean KL divergence, paired over the windows (each method scored on the same windows)."""
    def per_window(suffix):
        row = next((r for r in rows if (_m(r, "label") or "").startswith("int4 g")
                    and (_m(r, "label") or "").endswith(suffix) and "g32" not in _m(r, "label")
                    and r["config"]["kv_cache"] == "f32"), None)
        found = None if row is None else _m(row, "kl_per_window")
        return None if not found or len(found) < 2 else np.asarray(found, np.float64)

    rtn = per_window(" g128" if _find(rows, "int4 g128") else " g64")
    parts = []
    for name in ("GPTQ", "AWQ"):
        other = per_window(f" {name}")
        if rtn is None or other is None or len(other) != len(rtn):
            continue
        difference = stats.bootstrap_difference(stats.mean, other, rtn)
        judged = results.verdict(difference, above="higher", below="lower", units="windows")
        parts.append(f"{name} minus round to nearest {difference:+.2g} ({judged})")
    if not parts:
        return ""
    return ("- The same rows by mean KL divergence, paired over the windows: " + "; ".join(parts)
            + ". The perplexity differences above are of the size the windows' noise moves a "
            "perplexity; the KL divergence compares the methods token by token.")


def _reading(rows) -> str:
    """Where this model agrees with the published anchors (``ANCHORS``) and where it differs, with
    the rows' numbers; the reasons are the page's reading, not measured here."""
    def kl(label, kv="f32"):
        row = _find(rows, label, kv)
        return None if row is None else _m(row, "kl_mean")

    def ppl(label):
        row = _find(rows, label)
        return None if row is None else _m(row, "perplexity_diff")

    lines = []
    pairs = [("int8", "f32", "llama.cpp's q8_0 (blocks of 32)", 0.00136),
             ("int4 g32", "f32", "q4_0 (int4, absmax, blocks of 32: the same scheme)", 0.0719),
             ("f32", "int8", "a q8_0 KV cache", 0.00098)]
    for label, kv, anchor, value in pairs:
        ours = kl(label, kv)
        if ours is not None:
            what = f"{label} weights" if kv == "f32" else "an int8 KV cache"
            lines.append(f"- {what}: mean KLD {ours:.2g} here against {value} for {anchor} on "
                         f"LLaMA-3-8B ({ours / value:.2g}x).")
    minmax = kl("int4 g32 min-max")
    if minmax is not None:
        lines.append(f"- int4 g32 min-max weights: mean KLD {minmax:.2g} (the grid paragraph "
                     f"below).")
    rtn, gptq, awq = ppl("int4 g128" if _find(rows, "int4 g128") else "int4 g64"), None, None
    for row in rows:
        if _m(row, "label") and " GPTQ" in _m(row, "label") and row["config"]["kv_cache"] == "f32":
            gptq = _m(row, "perplexity_diff")
        if _m(row, "label") and " AWQ" in _m(row, "label") and row["config"]["kv_cache"] == "f32":
            awq = _m(row, "perplexity_diff")
    if None not in (rtn, gptq, awq):
        order = sorted([("round to nearest", rtn), ("GPTQ", gptq), ("AWQ", awq)],
                       key=lambda p: p[1])
        lines.append("- int4 at the larger group size, perplexity increase over the reference: "
                     + ", ".join(f"{name} {value:+.3g}" for name, value in order)
                     + " (AWQ paper, LLaMA-7B: AWQ +0.10, round to nearest +0.28, GPTQ +0.54).")
        lines.append(_methods_by_kl(rows))
    lines = [line for line in lines if line]
    if not lines:
        return ""
    return ("**Against the anchors.**\n" + "\n".join(lines) + "\n\n" + READING)


def report(rows, out_dir) -> list[pathlib.Path]:
    """One page per reference model: ``quantization.md`` (medium) or
    ``quantization_<preset>.md``."""
    out_dir = pathlib.Path(out_dir)
    groups: dict = {}
    for row in rows:
        groups.setdefault(_pretrained(row), []).append(row)
    written = []
    for pretrained, group in groups.items():
        name = "quantization" + ("" if pretrained is None else f"_{pretrained}")
        shape = group[0]["config"]["model"]
        model = (f"a model of width {shape['d_model']} and {shape['n_layers']} layers (the "
                 f"`medium` preset unless overridden) trained on the corpus"
                 if pretrained is None else
                 f"the pretrained `{pretrained}` (reference: its GGUF file dequantized to float32)")
        page = results.Page(f"Quantization: {model}", group)
        c = group[0]["config"]
        page.text(f"Reference: {model}. Scoreboard (`dl.compare`) on {c['num_windows']} windows "
                  f"of {c['window_tokens']} held-out tokens; decode speed: greedy "
                  f"`dl.generate` of {c['new_tokens']} tokens, medians of {c['repeats']} runs "
                  f"interleaved with the float32 reference (speed-up = reference seconds / "
                  f"candidate seconds). See `experiments/quantization.py` for every column.")
        page.text(_targets(group, pretrained))
        page.text(_reading(group))
        page.table(_table(group), out_dir / f"{name}.csv", number_format="{:.4g}")
        page.image(_plot(group, out_dir / f"{name}.png"), "mean KL divergence against bytes")
        page.text(MATMUL)
        page.text(ANCHORS)
        written += [page.write(out_dir / f"{name}.md"), out_dir / f"{name}.csv",
                    out_dir / f"{name}.png"]
    return written


def main(argv) -> None:
    del argv
    experiment.run_from_flags(_FLAGS, evaluate)


if __name__ == "__main__":
    app.run(main)
