"""Quantization: weights stored as int8 / int4 and KV caches stored as int8 / int4, judged by KL
divergence to the float32 model (llama.cpp's scoreboard) and by decode speed.

    python -m experiments.quantization --config=configs/quantization.py --workdir=runs/quantization
    python -m experiments.report --workdir=runs/quantization --out=results

One point = one (weights, group size, scheme, method, KV cache), the self-draft row or a llama.cpp
row. Its metrics:

- the scoreboard (``dl.compare``: ``kl_mean``, ``kl_p99``, ``same_top``, ``rms_top_prob``, both
  perplexities, ``*_per_window``) of the candidate, read through a KV cache of the point's kind,
  against the float32 reference on ``num_windows`` windows of ``window_tokens + 1`` test-play
  tokens; ``parameter_bytes`` at each element's bit width; ``kv_bytes_per_token``;
- ``tokens_per_s_b<B>``, ``reference_reps_s_b<B>``, ``reps_s_b<B>``, ``speedup_b<B>``: greedy
  decoding against the reference, runs interleaved (``decodelab.measure.compression``);
- the self-draft row: ``alpha`` and ``speedup_b1`` of ``speculative_generate`` drafting with the
  reference's own int4 g32 copy (``measure.compression.time_self_draft``);
- the llama.cpp rows (a pretrained model, ``peer``): the scoreboard of llama.cpp's logits from the
  model's GGUF file, as stored or as llama.cpp's own float32, Q8_0, Q4_0 or Q4_K_M conversion,
  and its decode speed at batch 1 (``parameter_bytes``: the file's tensor bytes; ``note`` where
  ``llama-cpp-python`` is not installed);
- ``load_1min``: the machine's 1-minute load average when the point started.
"""

from __future__ import annotations

import functools
import os


import decodelab as dl
from decodelab import experiment, report
from decodelab.experiment import compression as candidates
from decodelab.experiment import presets
from decodelab.measure.compression import llama_cpp_scoreboard, time_decoding, time_self_draft
from decodelab.report import compression
from decodelab.report import quantization_tables as tables
from decodelab.report.compression import (Target, against, kl_minus, scoreboard, speed,
                                          speed_over, windows_compared)
from decodelab.text.data import token_windows

_FLAGS = experiment.define_flags("configs/quantization.py")


def evaluate(config, ctx) -> dict:
    """One point: the metrics of the module docstring."""
    load = os.getloadavg()[0]
    candidates.check_quantization(config)
    model, tokenizer = candidates.reference_model(config, ctx)
    row = {"label": candidates.quantization_label(config), "load_1min": load}
    windows = token_windows(tokenizer, "test", config.num_windows, config.window_tokens + 1)
    prompts = token_windows(tokenizer, "test", max(config.batch_sizes),
                            config.prompt_tokens).tolist()
    if config.peer:
        ctx.status(config.peer)
        return {**row, **llama_cpp_scoreboard(
            model, presets.pretrained_path(config.model.pretrained), windows, prompts[0],
            config.new_tokens, config.repeats, ftype=candidates.peer_ftype(config.peer))}
    if config.self_draft:
        ctx.status("self-draft")
        return {**row, **time_self_draft(model, prompts, config.gamma, config.new_tokens,
                                         config.repeats, config.seed)}
    ctx.status("quantize")
    candidate = candidates.quantized(config, model, tokenizer)
    ctx.status("scoreboard")
    kv = None if config.kv_cache == "f32" else config.kv_cache
    board = dl.compare(model, candidate, windows, candidate_kv_cache=kv)
    row.update(board.as_dict())
    row["parameter_bytes"] = board.parameter_bytes_candidate
    row["kv_bytes_per_token"] = board.kv_bytes_per_token_candidate
    row.update(time_decoding(model, candidate, prompts, config.batch_sizes, config.new_tokens,
                             config.repeats, kv_cache=kv, status=ctx.status))
    return row


def targets_of(subject: str, label: str, kl: float = 0.002, pages: str = "all") -> list[Target]:
    """An int8 weight row's targets: mean KLD <= ``kl`` and same top >= 97% over the windows, and
    speed-ups >= 1.6x at batch 1 and >= 1.3x at batch 8 over the timed runs."""
    where = tables.candidate(label)
    return [Target(subject, "mean KLD", scoreboard("kl_mean", where), kl, at_least=False,
                   pages=pages),
            Target(subject, "same top", scoreboard("same_top", where), 97.0, unit="%",
                   pages=pages),
            Target(subject, "speed-up at batch 1", speed(1, where), 1.6, units="timed runs",
                   unit="x", pages=pages),
            Target(subject, "speed-up at batch 8", speed(8, where), 1.3, units="timed runs",
                   unit="x", pages=pages)]


def peer_targets() -> list[Target]:
    """Beside llama.cpp's own quantizations of the same file (pretrained pages): int8 and int4
    g32 decode at >= 0.8x the tok/s of Q8_0 and Q4_0 at batch 1; int4 g32 keeps the top token at
    least as often as Q4_0 and its mean KLD is within 1.2x of Q4_0's, calibrated by GPTQ (the
    stored bytes and speed of round to nearest's)."""
    q8, q4 = ({"label": candidates.PEERS[f"llama.cpp-{name}"]} for name in ("q8_0", "q4_0"))
    int8, int4 = tables.candidate("int8"), tables.candidate("int4 g32")
    gptq = tables.candidate("int4 g32 GPTQ")
    batch_1 = functools.partial(speed_over, B=1)
    return [Target("int8 weights", "tok/s at batch 1 / llama.cpp Q8_0's",
                   against(int8, q8, batch_1), 0.8, units="timed runs", unit="x",
                   pages="pretrained"),
            Target("int4 g32 weights", "tok/s at batch 1 / llama.cpp Q4_0's",
                   against(int4, q4, batch_1), 0.8, units="timed runs", unit="x",
                   pages="pretrained"),
            Target("int4 g32 GPTQ weights", "same top minus llama.cpp Q4_0's",
                   against(gptq, q4, lambda a, b: windows_compared(a, b, "same_top")), 0.0,
                   unit="%", pages="pretrained"),
            Target("int4 g32 GPTQ weights", "mean KLD / llama.cpp Q4_0's",
                   against(gptq, q4, lambda a, b: windows_compared(a, b, ratio=True)), 1.2,
                   at_least=False, unit="x", pages="pretrained")]


# The targets, as data: what is measured on which row, the threshold and the comparison.
TARGETS = (
    *targets_of("int8 weights", "int8"),
    *targets_of("int8 W8A8 (integer dot)", "int8 W8A8", kl=0.01),
    *targets_of("int8 W8A8x2 (two-term activations)", "int8 W8A8x2"),
    *targets_of("int8 g32 weights (as Q8_0)", "int8 g32", pages="pretrained"),
    *targets_of("int8 g32 W8A8 (as Q8_0's dot)", "int8 g32 W8A8", kl=0.01, pages="pretrained"),
    *targets_of("int8 g32 W8A8x2", "int8 g32 W8A8x2", pages="pretrained"),
    *targets_of("int8 g32 weights, head too", "int8 g32 +head", pages="pretrained"),
    *targets_of("int8 g32 W8A8, head too", "int8 g32 W8A8 +head", kl=0.01, pages="pretrained"),
    *targets_of("int8 W8A8, head too", "int8 W8A8 +head", kl=0.01, pages="pretrained"),
    *targets_of("int8 W8A8x2, head too", "int8 W8A8x2 +head", pages="pretrained"),
    Target("int8 KV cache", "mean KLD", scoreboard("kl_mean", tables.candidate("f32", "int8")),
           0.002, at_least=False),
    Target("int4 g32 weights", "same top", scoreboard("same_top", tables.candidate("int4 g32")),
           90.0, unit="%", pages="pretrained"),
    *[Target("int4 at the larger group size, mean KLD minus round to nearest's", name,
             kl_minus(tables.larger_group(method), tables.larger_group("rtn")), 0.0,
             at_least=False) for name, method in (("GPTQ", "gptq"), ("AWQ", "awq"))],
    *peer_targets(),
)


def forms(rows) -> list[report.Form]:
    """One page per reference model: ``quantization`` (trained) or ``quantization_<model>``."""
    return compression.model_forms(
        "quantization", rows, lambda group: TARGETS, tables,
        lambda group: {"scoreboard": tables.scoreboard_table},
        "mean KL divergence against parameter bytes, per KV cache")


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
