"""Position-encoding length extrapolation: validation perplexity at 1x, 2x, 4x and 8x the training
length for each encoding, and RoPE with inference-time scaling.

    python -m experiments.extrapolation --config=configs/extrapolation.py --workdir=runs/extrapolation
    python -m experiments.report --workdir=runs/extrapolation --out=results

Two numbers per point, both on the same leading validation tokens:

- ``perplexity``: non-overlapping windows of the evaluation length (as in Press et al.): every token
  is scored, with 1 .. context tokens before it, so it averages short and long contexts.
- ``tail_perplexity``: sliding windows of the evaluation length advanced by L, scoring only each
  window's last L tokens, i.e. only positions (factor - 1) L .. factor L - 1: the positions the
  model never saw in training. At factor 1 it equals ``perplexity`` up to the first window.
"""

from __future__ import annotations

import pathlib

from absl import app

from decodelab import data, experiment, metrics, pipeline, results
from decodelab.model import with_config

_FLAGS = experiment.define_flags("configs/extrapolation.py")


def encoding_label(position: str, rope_scaling: str) -> str:
    return position if rope_scaling == "none" else f"{position}+{rope_scaling}"


def evaluate(config, ctx) -> dict:
    model, tokenizer = pipeline.trained_model(config.tokenizer, config.model, config.train,
                                              ctx.workdir, progress=ctx.show_progress)
    train_len = config.train.seq_len
    context = train_len * config.eval.factor
    label = encoding_label(config.model.position, config.eval.rope_scaling)
    if config.eval.rope_scaling != "none":
        if config.model.position != "rope":
            raise ValueError(f"eval.rope_scaling={config.eval.rope_scaling!r} needs "
                             f"model.position='rope', got {config.model.position!r}")
        model = with_config(model, model.config.replace(
            rope_scaling=config.eval.rope_scaling, rope_scaling_factor=float(config.eval.factor),
            rope_original_max_len=train_len))
    row = {"encoding": label, "context_len": context, "factor": config.eval.factor}
    limit = model.positions.max_positions
    if limit is not None and context > limit:
        # Not a number it cannot have: a learned table has no row for these positions.
        return {**row, "perplexity": None, "tail_perplexity": None, "bits_per_char": None,
                "note": f"n/a: {config.model.position} has {limit} positions"}
    stream = data.token_stream(tokenizer, "validation")[:config.eval.max_tokens + 1]
    num_chars = len(tokenizer.decode(stream.tolist()))
    ctx.status(f"{label} @ {context}")
    whole = metrics.perplexity(model, stream, context, mode="chunks",
                               batch_size=config.eval.batch_size, num_chars=num_chars)
    tail = metrics.perplexity(model, stream, context, mode="sliding", stride=train_len,
                              batch_size=config.eval.batch_size)
    return {**row, "perplexity": whole["perplexity"], "bits_per_char": whole["bits_per_char"],
            "tokens": whole["tokens"], "tail_perplexity": tail["perplexity"],
            "tail_tokens": tail["tokens"], "note": ""}


def _ratio_lines(rows) -> list[str]:
    """Per encoding: perplexity at the longest context over that at L, computed from the rows."""
    by = {}
    for row in rows:
        m = row["metrics"]
        by.setdefault(m["encoding"], {})[m["factor"]] = m["tail_perplexity"]
    lines = []
    for label, at in by.items():
        top = max(at)
        if at.get(1) and at.get(top):
            lines.append(f"| {label} | {at[1]:.1f} | {at[top]:.1f} | {at[top] / at[1]:.2f} |")
        elif at.get(1):
            lines.append(f"| {label} | {at[1]:.1f} | n/a | n/a |")
    return lines


def report(rows, out_dir) -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    train_len = rows[0]["config"]["train"]["seq_len"]
    top = max(r["metrics"]["factor"] for r in rows)
    page = results.Page("Position-encoding length extrapolation", rows)
    page.text(
        f"Validation perplexity of one `small` model per position encoding, all trained at length "
        f"L = {train_len} with the same data, budget and seed, evaluated at L, 2L, 4L, 8L on the "
        f"same {rows[0]['metrics'].get('tokens', 0):,} leading validation tokens. `rope+linear`, "
        "`rope+ntk` and `rope+yarn` are the RoPE model with that scaling applied at inference time "
        "(factor = context / L), without retraining. `n/a`: a learned table has no row for those "
        "positions. See `experiments/extrapolation.py` for exactly what is scored.")
    tail_table = results.pivot_table(rows, index="metrics.encoding", columns="metrics.context_len",
                                     values="metrics.tail_perplexity")
    page.table(tail_table, out_dir / "extrapolation_tail.csv", number_format="{:.1f}",
               caption=f"**Perplexity of the last L = {train_len} tokens of each window** "
                       "(positions (factor-1)L .. factor L - 1, each with at least (factor-1)L "
                       "tokens of context): what the model does at positions it never trained on.")
    whole_table = results.pivot_table(rows, index="metrics.encoding",
                                      columns="metrics.context_len", values="metrics.perplexity")
    page.table(whole_table, out_dir / "extrapolation.csv", number_format="{:.1f}",
               caption="**Perplexity over non-overlapping windows** of the context length "
                       "(every token scored; Press et al.'s protocol).")
    plots = []
    for metric, name in (("tail_perplexity", "extrapolation_tail.png"),
                         ("perplexity", "extrapolation.png")):
        path = results.line_plot(rows, out_dir / name, x="metrics.context_len",
                                 y=f"metrics.{metric}", group="metrics.encoding", logx=True,
                                 logy=True, title=f"{metric.replace('_', ' ')} vs context length")
        page.image(path, f"{metric} against context length, one line per encoding")
        plots.append(path)
    page.text("\n".join([
        f"Tail perplexity at {top}L over that at L (from the table above):", "",
        f"| encoding | at L | at {top}L | ratio |", "|---|---|---|---|", *_ratio_lines(rows)]))
    notes = out_dir / "extrapolation_notes.md"
    if notes.exists():
        page.text(notes.read_text(encoding="utf-8"))
    return [page.write(out_dir / "extrapolation.md"), out_dir / "extrapolation.csv",
            out_dir / "extrapolation_tail.csv", *plots]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
