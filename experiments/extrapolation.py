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

Each row also keeps every window's NLL sum (``window_nll``, ``tail_window_nll``): the page's 95%
intervals resample the windows (``decodelab.measure.stats``), and a comparison of two encodings at one
length is paired, window by window (both read the same windows). The sweep trains `rope`,
`alibi`, `sinusoidal` and `t5` with three seeds (``train.seed``); the page's tables are the first
seed's, with the spread over seeds beside them, and each claim is judged on every seed that trained
what it compares: called only when every seed's interval calls it the same way.
"""

from __future__ import annotations

import pathlib

import numpy as np
from absl import app

from decodelab import experiment
from decodelab import report as results
from decodelab.experiment import artefacts as pipeline
from decodelab.measure import perplexity as metrics
from decodelab.measure import stats
from decodelab.model import with_config
from decodelab.text import data

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
            "tail_tokens": tail["tokens"], "note": "",
            # Per window, the NLL summed over its scored targets (context targets per window for
            # the non-overlapping windows, L for the tail's): what the page's intervals resample.
            "window_nll": whole["window_nll"], "window_tokens": context,
            "tail_window_nll": tail["window_nll"], "tail_window_tokens": train_len}


NO_WINDOWS = ("the row keeps no per-window values (written by an earlier version of the study); "
              "rerun it for intervals")

# Comparisons the page judges, window by window at one length: (a, b, factor (None: the longest),
# the claim it tests). A positive difference a - b means a has the higher perplexity.
COMPARISONS = (
    ("rope", "sinusoidal", None, "RoPE degrades as badly as sinusoidal"),
    ("rope+yarn", "rope", None, "YaRN recovers most of RoPE's loss without retraining"),
    ("rope+ntk", "rope", 2, "NTK-aware scaling helps RoPE at 2L"),
    ("rope+linear", "rope", 2, "linear position interpolation hurts without fine-tuning"),
    ("alibi", "t5", None, "ALiBi holds better than T5's buckets"),
)


def _seed(row) -> int:
    return row["config"]["train"]["seed"]


def _windows(m, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(NLL sums, scored targets), one per window, of ``metric`` (``perplexity`` or
    ``tail_perplexity``) in the row's metrics ``m``; None for a row without them."""
    prefix = metric.removesuffix("perplexity")
    nll = m.get(f"{prefix}window_nll")
    if m.get(metric) is None or not nll or len(nll) < 2 or not np.isfinite(m[metric]):
        return None
    return np.asarray(nll, np.float64), np.full(len(nll), float(m[f"{prefix}window_tokens"]))


def _with_intervals(row) -> dict:
    """The row with ``perplexity`` and ``tail_perplexity`` as Intervals over its windows (left as
    numbers where the row keeps no windows)."""
    m = row["metrics"]
    changed = {}
    for metric in ("perplexity", "tail_perplexity"):
        columns = _windows(m, metric)
        if columns is not None:
            changed[metric] = stats.bootstrap(stats.perplexity, columns)
    return results.with_metrics(row, **changed)


def _paired(a, b, metric: str = "tail_perplexity") -> stats.Interval | None:
    """perplexity(a) - perplexity(b), paired window by window (both rows read the same windows)."""
    ca, cb = _windows(a, metric), _windows(b, metric)
    if ca is None or cb is None or len(ca[0]) != len(cb[0]):
        return None
    return stats.bootstrap_difference(stats.perplexity, ca, cb)


def _by_encoding(rows) -> dict[int, dict[str, dict[int, dict]]]:
    """seed -> encoding -> factor -> metrics."""
    by: dict = {}
    for row in rows:
        m = row["metrics"]
        by.setdefault(_seed(row), {}).setdefault(m["encoding"], {})[m["factor"]] = m
    return by


def _growth(by_factor: dict[int, dict], top: int) -> tuple[float | None, results.Verdict] | None:
    """The tail perplexity at ``top`` L over that at L (an Interval where the rows keep windows,
    the two lengths' windows resampled independently) and its verdict on "it degrades"; None
    where either length has no value."""
    low, high = by_factor.get(1), by_factor.get(top)
    if low is None or high is None or None in (low["tail_perplexity"], high["tail_perplexity"]):
        return None
    cols_high, cols_low = _windows(high, "tail_perplexity"), _windows(low, "tail_perplexity")
    ratio = (stats.bootstrap_ratio(stats.perplexity, cols_high, cols_low)
             if cols_high and cols_low else None)
    judged = results.verdict(ratio, threshold=1.0, above="degrades", below="improves",
                             units="windows per length", missing=NO_WINDOWS)
    return (ratio if ratio else high["tail_perplexity"] / low["tail_perplexity"]), judged


def _growth_table(by: dict[int, dict[str, dict[int, dict]]], first: int, top: int
                  ) -> results.Table:
    """Per encoding evaluated at L and at ``top`` L: the first seed's tail perplexity ratio with
    its interval and its verdict on "it degrades", and the verdict over every seed that trained
    the encoding (``results.across_seeds``)."""
    body = []
    for label, by_factor in by[first].items():
        if 1 not in by_factor:
            continue
        growth = {s: _growth(at[label], top) for s, at in sorted(by.items()) if label in at}
        if growth[first] is None:
            body.append([label, by_factor[1]["tail_perplexity"], None, None, "n/a", "n/a"])
            continue
        judged = {s: g[1] for s, g in growth.items() if g is not None}
        others = ", ".join(f"{g[0]:.2f} (seed {s})" for s, g in growth.items()
                           if s != first and g is not None)
        body.append([label, by_factor[1]["tail_perplexity"], by_factor[top]["tail_perplexity"],
                     growth[first][0], growth[first][1].text,
                     f"{others}: {results.across_seeds(judged).text}" if others else
                     "one seed"])
    return results.Table(["encoding", "at L", f"at {top}L", "ratio", "verdict",
                          "other seeds' ratios: verdict over seeds"], body)


def _tail(at: dict[str, dict[int, dict]], label: str, factor: int) -> float | None:
    return at.get(label, {}).get(factor, {}).get("tail_perplexity")


def _judged(a: dict, b: dict, **labels) -> tuple[str, results.Verdict]:
    """tail perplexity(a) - tail perplexity(b) as shown (with its paired interval where the rows
    keep windows) and its verdict (``labels``: ``above`` and ``below``)."""
    difference = _paired(a, b)
    shown = (f"{difference:+.1f}" if difference else
             f"{a['tail_perplexity'] - b['tail_perplexity']:+.1f}")
    return shown, results.verdict(difference, units="windows", missing=NO_WINDOWS, **labels)


def _over_seeds(judged: dict[int, tuple[str, results.Verdict]]) -> str:
    """``shown: **verdict**`` for one seed; for several, each seed's shown difference and verdict,
    then the claim over seeds in bold (``results.across_seeds``)."""
    if len(judged) == 1:
        (shown, verdict), = judged.values()
        return f"{shown}: **{verdict.text}**"
    each = "; ".join(f"seed {s}: {shown}, {verdict.text}" for s, (shown, verdict) in judged.items())
    overall = results.across_seeds({s: verdict for s, (_, verdict) in judged.items()})
    return f"{each}. Over seeds: **{overall.text}**"


def _comparison_lines(by: dict, first: int, top: int) -> list[str]:
    """The claims of ``COMPARISONS`` and which encoding is best at L and at ``top`` L, each
    judged on every seed that trained what it compares (a paired interval over that seed's
    windows) and called only when every seed calls it the same way (``results.across_seeds``)."""
    lines = []
    for a, b, factor, claim in COMPARISONS:
        factor = factor or top
        judged = {s: _judged(at[a][factor], at[b][factor],
                             above=f"{a} is worse (higher perplexity)",
                             below=f"{a} is better (lower perplexity)")
                  for s, at in sorted(by.items())
                  if None not in (_tail(at, a, factor), _tail(at, b, factor))}
        if first in judged:
            lines.append(f"- *{claim}* ({factor}L): tail perplexity {a} - {b}"
                         f"{' = ' if len(judged) == 1 else ', '}{_over_seeds(judged)}.")
    for factor in sorted({1, top}):
        judged = {}
        for s, at in sorted(by.items()):
            plain = sorted(((m[factor]["tail_perplexity"], label) for label, m in at.items()
                            if "+" not in label and factor in m
                            and m[factor]["tail_perplexity"] is not None))
            if len(plain) < 2:
                continue
            (low, best), (second, runner_up) = plain[:2]
            shown, verdict = _judged(at[runner_up][factor], at[best][factor],
                                     above=f"{best} is the best encoding",
                                     below=f"{runner_up} is the best encoding")
            judged[s] = (f"{best} ({low:.1f}), then {runner_up} ({second:.1f}), of "
                         f"{len(plain)} encodings; {runner_up} - {best} = {shown}", verdict)
        if first in judged:
            lines.append(f"- *The lowest tail perplexity at {'L' if factor == 1 else f'{factor}L'}"
                         "*" + (" (among the encodings each seed trained)" if len(judged) > 1
                                else "") + f": {_over_seeds(judged)}.")
    return lines


def _seed_table(rows, first: int) -> results.Table | None:
    """Per encoding and length with several seeds: each seed's tail perplexity, their mean and
    range, beside the first seed's window interval."""
    cells: dict[tuple, dict[int, dict]] = {}
    for row in rows:
        m = row["metrics"]
        cells.setdefault((m["encoding"], m["context_len"]), {})[_seed(row)] = m
    body = []
    for (label, context), by_seed in cells.items():
        values = [by_seed[s]["tail_perplexity"] for s in sorted(by_seed)]
        if len(values) < 2 or None in values:
            continue
        window = (stats.bootstrap(stats.perplexity, _windows(by_seed[first], "tail_perplexity"))
                  if first in by_seed and _windows(by_seed[first], "tail_perplexity") else None)
        body.append([label, context, ", ".join(str(s) for s in sorted(by_seed)),
                     float(np.mean(values)), min(values), max(values), max(values) - min(values),
                     None if window is None else window.high - window.low])
    if not body:
        return None
    return results.Table(["encoding", "context_len", "seeds", "mean", "min", "max",
                          "seed range", f"seed {first} window 95% width"], body)


def report(rows, out_dir) -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    train_len = rows[0]["config"]["train"]["seq_len"]
    top = max(r["metrics"]["factor"] for r in rows)
    first = min(_seed(r) for r in rows)
    windows_kept = all(_windows(r["metrics"], "tail_perplexity") for r in rows
                       if r["metrics"]["tail_perplexity"] is not None)
    shown = [_with_intervals(r) for r in rows if _seed(r) == first]
    seeds = _seed_table(rows, first)
    page = results.Page("Position-encoding length extrapolation", rows)
    page.text(
        f"Validation perplexity of one `small` model per position encoding, all trained at length "
        f"L = {train_len} with the same data, budget and seed ({first}), evaluated at L, 2L, 4L, "
        f"8L on the same {rows[0]['metrics'].get('tokens', 0):,} leading validation tokens. "
        "`rope+linear`, `rope+ntk` and `rope+yarn` are the RoPE model with that scaling applied "
        "at inference time (factor = context / L), without retraining. `n/a`: a learned table "
        "has no row for those positions. See `experiments/extrapolation.py` for exactly what is "
        "scored. "
        + ("Brackets: 95% percentile bootstrap interval over the evaluation windows (2,000 "
           "resamples, fixed seed; `decodelab.measure.stats`). It measures what other text of the same "
           "plays could move, not what another training seed could"
           + (": the seed table below does that." if seeds else
              " (these rows hold one seed per encoding).")
           if windows_kept else f"No intervals: {NO_WINDOWS}."))
    tail_table = results.pivot_table(shown, index="metrics.encoding",
                                     columns="metrics.context_len",
                                     values="metrics.tail_perplexity")
    page.table(tail_table, out_dir / "extrapolation_tail.csv", number_format="{:.1f}",
               caption=f"**Perplexity of the last L = {train_len} tokens of each window** "
                       "(positions (factor-1)L .. factor L - 1, each with at least (factor-1)L "
                       "tokens of context): what the model does at positions it never trained on.")
    whole_table = results.pivot_table(shown, index="metrics.encoding",
                                      columns="metrics.context_len", values="metrics.perplexity")
    page.table(whole_table, out_dir / "extrapolation.csv", number_format="{:.1f}",
               caption="**Perplexity over non-overlapping windows** of the context length "
                       "(every token scored; Press et al.'s protocol).")
    plots = []
    for metric, name in (("tail_perplexity", "extrapolation_tail.png"),
                         ("perplexity", "extrapolation.png")):
        path = results.line_plot(shown, out_dir / name, x="metrics.context_len",
                                 y=f"metrics.{metric}", group="metrics.encoding", logx=True,
                                 logy=True, title=f"{metric.replace('_', ' ')} vs context length, "
                                 f"seed {first}"
                                 + (" (95% interval over windows)" if windows_kept else ""))
        page.image(path, f"{metric} against context length, one line per encoding (seed {first})")
        plots.append(path)
    by = _by_encoding(rows)
    growth = _growth_table(by, first, top)
    page.table(growth, out_dir / "extrapolation_growth.csv", number_format="{:.2f}",
               caption=f"**Tail perplexity at {top}L over that at L** (seed {first}), with its "
                       "interval (the windows of the two lengths resampled independently) and "
                       "the verdict on \"it degrades\": called only when the interval excludes "
                       "1; the last column, the other seeds' ratios and the verdict over seeds: "
                       "called only when every seed's interval calls it.")
    page.text("**Claims, judged by the intervals** (a paired bootstrap of the difference, window "
              "by window; called only when its interval excludes 0, and where several seeds "
              "trained what a claim compares, only when every seed's interval excludes 0 on the "
              "same side):\n\n" + "\n".join(_comparison_lines(by, first, top)))
    if seeds is not None:
        page.table(seeds, out_dir / "extrapolation_seeds.csv", number_format="{:.1f}",
                   caption="**Tail perplexity over training seeds** (each seed a model trained "
                           "from scratch with its own initialisation and data order), beside the "
                           "width of the first seed's window interval: where the seed range is "
                           "wider, the window interval understates what a rerun could move.")
    notes = out_dir / "extrapolation_notes.md"
    if notes.exists():
        page.text(notes.read_text(encoding="utf-8"))
    return [page.write(out_dir / "extrapolation.md"), out_dir / "extrapolation.csv",
            out_dir / "extrapolation_tail.csv", out_dir / "extrapolation_growth.csv",
            *([out_dir / "extrapolation_seeds.csv"] if seeds is not None else []), *plots]

def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
