"""The pruning pages' tables, plot, method, caveats and the figures their targets read, from one
reference model's rows (``compression.page_rows``): weights zeroed (magnitude, Wanda; unstructured
and N:M), head groups and hidden units removed, with and without recovery, some quantized on top
(``decodelab.experiment.compression.pruned``)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from decodelab.measure.compression import layers
from decodelab.report.compression import (bars, cell, find, metric, model_text, one, point,
                                          speed_cell, times)
from decodelab.report.tables import Table, format_number

Rows = Sequence[Mapping[str, Any]]
# What makes a candidate (with ``recovery_steps``): a recovered row's twin has the same.
CANDIDATE_KEYS = ("kind", "method", "sparsity", "fraction", "importance", "weights")
# Published anchors (the Wanda README, Llama-2-7B, wikitext-2 perplexity; not rerun here): dense,
# then per pattern (magnitude, Wanda, SparseGPT).
ANCHOR_DENSE_PPL = 5.12
ANCHOR_PPL = {"50%": (14.89, 6.42, 6.51), "2:4": (54.59, 11.02, 10.17), "4:8": (16.48, 7.97, None)}
# The patterns of the anchors and of Wanda against magnitude: (name, kind, sparsity).
PATTERNS = (("10%", "unstructured", 0.1), ("30%", "unstructured", 0.3),
            ("50%", "unstructured", 0.5), ("70%", "unstructured", 0.7), ("2:4", "2:4", 0.5),
            ("4:8", "4:8", 0.5))
DENSE = {"config.kind": "dense", "config.recovery_steps": 0, "config.weights": ""}
NEURONS_25 = {"config.kind": "neurons", "config.fraction": 0.25, "config.recovery_steps": 0,
              "config.weights": ""}
HEADS_25 = {"config.kind": "heads", "config.fraction": 0.25, "config.recovery_steps": 0}


def pruned(kind: str, method: str, sparsity: float) -> dict:
    """``where`` of the ``method`` row of a weight pattern, no recovery, float weights (the
    sparsity counts for unstructured rows only: N:M fixes it)."""
    where = {"config.kind": kind, "config.method": method, "config.recovery_steps": 0,
             "config.weights": ""}
    return {**where, "config.sparsity": sparsity} if kind == "unstructured" else where


def where_of(row: Mapping[str, Any], recovery_steps: int | None = None) -> dict:
    """``where`` of the row's candidate (with ``recovery_steps`` instead of its own, if given)."""
    c = row["config"]
    steps = c["recovery_steps"] if recovery_steps is None else recovery_steps
    return {**{f"config.{k}": c.get(k) for k in CANDIDATE_KEYS}, "config.recovery_steps": steps}


def recovery_pairs(rows: Rows) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(recovered row, the same pruning without recovery) for each recovered pruned row that has
    one (the unpruned model's recovery alone is the baseline, not a pair)."""
    pairs = []
    for r in rows:
        c = r["config"]
        if not c["recovery_steps"] or (c["kind"] == "dense" and not c["weights"]):
            continue
        twin = find(rows, where_of(r, 0))
        if twin is not None:
            pairs.append((r, twin))
    return pairs


# --- figures the targets read -------------------------------------------------------------------


def largest_sparsity_miss(rows: Rows) -> float | None:
    """The largest |measured - requested| sparsity over the unstructured and N:M rows with float
    weights (N:M requests N / M = 0.5); None without such rows."""
    misses = [abs(metric(r, "sparsity") - (r["config"]["sparsity"] if r["config"]["kind"] ==
                                          "unstructured" else 0.5))
              for r in rows if r["config"]["kind"] in ("unstructured", "2:4", "4:8")
              and not r["config"]["weights"]]
    return max(misses, default=None)


def weight_bytes_ceiling(rows: Rows) -> float | None:
    """The dense model's parameter bytes over those of 25% of the hidden units removed: what a
    step bound by reading its weights gains at most."""
    dense, neurons = one(rows, DENSE), one(rows, NEURONS_25)
    if dense is None or neurons is None:
        return None
    return metric(dense, "parameter_bytes") / metric(neurons, "parameter_bytes")


def wall_minutes(rows: Rows) -> float:
    """The study's points' wall time, in minutes."""
    return sum(r.get("wall_time_s", 0.0) for r in rows) / 60


def speed_per_nat(row: Mapping[str, Any]) -> float | None:
    """Structured removal and quantization without recovery: the speed-up at batch 1 bought per
    nat of mean KL divergence, ``(speed-up - 1) / KLD``."""
    c = row["config"]
    kl, speedup = metric(row, "kl_mean"), metric(row, "speedup_b1")
    if (c["recovery_steps"] or not (c["kind"] in ("heads", "neurons") or c["weights"])
            or kl is None or speedup is None or kl <= 0):
        return None
    return (speedup - 1) / kl


# --- tables and the plot ------------------------------------------------------------------------


def main_table(rows: Rows) -> Table:
    return Table(["candidate", "params (M)", "sparsity", "mean KLD", "same top %", "ppl",
                  "speed-up b1"],
                 [[metric(r, "label"), metric(r, "params") / 1e6, metric(r, "sparsity"),
                   cell(r, "kl_mean"), cell(r, "same_top"), metric(r, "perplexity_candidate"),
                   speed_cell(r, 1)] for r in rows])


def scoreboard_table(rows: Rows) -> Table:
    """Every figure of every row, and the speed-up bought per nat (``speed_per_nat``)."""
    columns = ["candidate", "params (M)", "param MB", "sparsity", "mean KLD", "p99 KLD",
               "same top %", "ppl", "ppl diff", "tok/s b1", "speed-up b1", "tok/s b8",
               "speed-up b8", "speed-up b1 per nat"]
    return Table(columns, [[metric(r, "label"), metric(r, "params") / 1e6,
                            metric(r, "parameter_bytes") / 1e6, metric(r, "sparsity"),
                            cell(r, "kl_mean"), metric(r, "kl_p99"), cell(r, "same_top"),
                            metric(r, "perplexity_candidate"), metric(r, "perplexity_diff"),
                            metric(r, "tokens_per_s_b1"), speed_cell(r, 1),
                            metric(r, "tokens_per_s_b8"), speed_cell(r, 8), speed_per_nat(r)]
                           for r in rows])


def removed_groups(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(importance [L, K], removed [L, K])`` of a heads row's key/value head groups."""
    importance = layers(metric(row, "head_importance"))  # [L, K]
    kept = layers(metric(row, "heads_kept")).astype(bool)  # [L, N]
    L, K = importance.shape
    return importance, ~kept.reshape(L, K, -1)[:, :, 0]


def heads_table(rows: Rows) -> Table:
    """Each key/value head group of the 25% heads row: its importance, rank and whether removed."""
    row = find(rows, HEADS_25)
    body = []
    if row is not None and metric(row, "heads_kept"):
        importance, removed = removed_groups(row)
        ranks = np.argsort(np.argsort(-importance, axis=1), axis=1)  # 0: the most important
        body = [[layer, group, float(importance[layer, group]), int(ranks[layer, group]),
                 "yes" if removed[layer, group] else "no"]
                for layer in range(importance.shape[0]) for group in range(importance.shape[1])]
    return Table(["layer", "key/value head group", "importance", "rank (0 the top)", "removed"],
                 body)


def csv_tables(rows: Rows) -> dict:
    """The page's further CSVs: every figure of every row, and the heads removed (where a 25%
    heads row keeps them)."""
    row = find(rows, HEADS_25)
    heads = {"heads": heads_table} if row is not None and metric(row, "heads_kept") else {}
    return {"scoreboard": scoreboard_table, **heads}


def plot(rows: Rows, path: pathlib.Path) -> pathlib.Path:
    """Mean KL divergence and perplexity against sparsity, one line per method and recovery."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for method, colour in (("magnitude", "tab:blue"), ("wanda", "tab:orange")):
        for steps in sorted({r["config"]["recovery_steps"] for r in rows}):
            group = sorted((r for r in rows if r["config"]["kind"] == "unstructured"
                            and r["config"]["method"] == method
                            and r["config"]["recovery_steps"] == steps),
                           key=lambda r: r["config"]["sparsity"])
            if not group:
                continue
            x = [100 * r["config"]["sparsity"] for r in group]
            style = dict(color=colour, marker="o", linestyle="-" if not steps else "--",
                         label=f"{method}" + (f", {steps} recovery steps" if steps else ""))
            kl = [cell(r, "kl_mean") for r in group]
            axes[0].errorbar(x, [point(k) for k in kl], yerr=bars(kl), capsize=3, **style)
            axes[1].plot(x, [metric(r, "perplexity_candidate") for r in group], **style)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean KL divergence to the dense model (nats)")
    axes[1].set_ylabel("perplexity (test windows)")
    dense = find(rows, {"config.kind": "dense", "config.weights": ""})
    if dense is not None:
        axes[1].axhline(metric(dense, "perplexity_reference"), color="grey", linewidth=0.8,
                        label="dense")
    for ax in axes:
        ax.set_xlabel("unstructured sparsity (%)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# --- question, method and caveats -----------------------------------------------------------------


def question(rows: Rows) -> str:
    return (f"How much of {model_text(rows[0]['config'])} can be pruned (weights zeroed, heads or "
            "hidden units removed) for how much KL divergence, and what does it buy in decode "
            "speed?")


def method(rows: Rows) -> list[str]:
    """How each number is made, in at most 8 lines."""
    c = rows[0]["config"]
    r = c["recovery"]
    lines = [
        f"Reference: {model_text(c)}. Weights zeroed by magnitude or by Wanda (|weight| x the "
        f"norm of its input, calibrated on {c['calibration_windows']} training windows of "
        f"{c['window_tokens']} tokens), unstructured or N:M; whole key/value head groups or MLP "
        "hidden units removed by their Taylor importance; some candidates then quantized (int8 "
        "W8A8, int4 g32).",
        "Scoreboard (`dl.compare`, as on the quantization page) against the dense float32 model "
        f"on {c['num_windows']} evenly spaced windows of {c['window_tokens']} held-out tokens; "
        "sparsity: the fraction of zero weights over the attention and MLP projections, measured "
        "on the candidate; params count the zeros (a zeroed weight is still stored and read).",
        f"Decode speed: greedy `dl.generate` of {c['new_tokens']} tokens after "
        f"{c['prompt_tokens']}-token prompts at batch 1 and 8, medians of {c['repeats']} runs "
        "interleaved with the dense model after a warm-up; speed-up = dense seconds / candidate "
        "seconds.",
        "Brackets: 95% bootstrap intervals over the windows (scoreboard; Wanda against magnitude "
        "and recovered against not recovered paired window by window) and over the timed runs, "
        "paired run by run (speed-ups).",
        "The neuron target's ceiling: the dense parameter bytes over the candidate's (a step "
        "bound by reading its weights gains at most that). Speed-up per nat (scoreboard CSV): "
        "(speed-up at batch 1 - 1) / mean KLD, for structured removal and quantization.",
    ]
    if any(row["config"]["recovery_steps"] for row in rows):
        lines.append(f"Recovery: {r['steps']} steps of {r['batch_size']} x {r['seq_len']} tokens "
                     f"of the corpus at peak learning rate {r['learning_rate']:g}, the pruned "
                     "weights held at zero.")
    if find(rows, HEADS_25) is not None:
        lines.append("Heads CSV: each layer's key/value head groups in the 25% heads row, their "
                     "importance, rank and whether removed.")
    return lines


def anchor_line(rows: Rows) -> str | None:
    """Perplexity added over the dense model by magnitude and by Wanda, here and at 7B."""
    parts = []
    for name, kind, sparsity in PATTERNS:
        if name not in ANCHOR_PPL:
            continue
        wanda = find(rows, pruned(kind, "wanda", sparsity))
        magnitude = find(rows, pruned(kind, "magnitude", sparsity))
        if wanda is None or magnitude is None:
            continue
        dense = metric(wanda, "perplexity_reference")
        here = (metric(magnitude, "perplexity_candidate") - dense,
                metric(wanda, "perplexity_candidate") - dense)
        at_7b = [a - ANCHOR_DENSE_PPL for a in ANCHOR_PPL[name][:2]]
        sparsegpt = ANCHOR_PPL[name][2]
        parts.append(f"{name}: magnitude +{here[0]:.2f}, Wanda +{here[1]:.2f} over dense "
                     f"{dense:.2f} here ({here[1] / here[0]:.0%} of magnitude's); at 7B magnitude "
                     f"+{at_7b[0]:.2f}, Wanda +{at_7b[1]:.2f} ({at_7b[1] / at_7b[0]:.0%})"
                     + ("" if sparsegpt is None else f", SparseGPT {sparsegpt}"))
    if not parts:
        return None
    return ("Perplexity added without recovery against the Wanda README's Llama-2-7B anchors "
            f"(wikitext-2, dense {ANCHOR_DENSE_PPL}; not rerun here): " + "; ".join(parts) + ".")


def neuron_line(rows: Rows) -> str | None:
    neurons, ceiling = one(rows, NEURONS_25), weight_bytes_ceiling(rows)
    if neurons is None or ceiling is None:
        return None
    dense = one(rows, DENSE)
    return (f"25% of hidden units removed decodes at {times(speed_cell(neurons, 1))} the dense "
            f"speed at batch 1 and removes {1 - 1 / ceiling:.1%} of the parameter bytes "
            f"({metric(dense, 'parameter_bytes') / 1e6:.1f} to "
            f"{metric(neurons, 'parameter_bytes') / 1e6:.1f} MB): a step bound by reading its "
            f"weights gains at most {ceiling:.2f}x, and reading the KV cache and each step's "
            "fixed costs do not shrink, so the gain is less.")


def recovery_line(rows: Rows) -> str | None:
    pairs = recovery_pairs(rows)
    if not pairs:
        return None
    lower_kl = sum(metric(r, "kl_mean") < metric(t, "kl_mean") for r, t in pairs)
    lower_ppl = sum(metric(r, "perplexity_candidate") < metric(t, "perplexity_candidate")
                    for r, t in pairs)
    alone = find(rows, {**DENSE, "config.recovery_steps": pairs[0][0]["config"]["recovery_steps"]})
    steps = ("" if alone is None else
             f" The same steps on the unpruned model move it to mean KLD "
             f"{format_number(point(cell(alone, 'kl_mean')))} (perplexity "
             f"{metric(alone, 'perplexity_candidate'):.2f}): what recovery costs by itself, so "
             "it pays only where pruning cost more.")
    return (f"Recovery lowered the mean KLD in {lower_kl} of {len(pairs)} pairs and the perplexity "
            f"in {lower_ppl}: it trains on the corpus, not towards the reference, so by itself "
            f"it moves the model away from what it is scored against.{steps} Recovery by "
            "distillation from the dense model (its logits as targets) would aim at the "
            "scoreboard itself.")


def heads_line(rows: Rows) -> str | None:
    """Whether each layer lost its least important head groups, and how far importance spreads."""
    row = find(rows, HEADS_25)
    if row is None or not metric(row, "heads_kept"):
        return None
    importance, removed = removed_groups(row)
    L, K = importance.shape
    ranks = np.argsort(np.argsort(-importance, axis=1), axis=1)
    lowest = all(set(np.nonzero(removed[layer])[0]) == set(np.argsort(importance[layer])[
        :removed[layer].sum()]) for layer in range(L))
    spread = importance.max(axis=1) / np.maximum(importance.min(axis=1), 1e-30)
    return (f"Which heads go first ({metric(row, 'label')}, the heads CSV): "
            f"{'each layer' if lowest else 'not every layer'} lost its least important groups by "
            f"{row['config']['importance']} importance; a layer's most important group scores "
            f"{spread.min():.1f}x to {spread.max():.1f}x its least, and the removed groups rank "
            f"{np.mean(ranks[removed]):.1f} on average among the {K} (0 the top).")


def caveats(rows: Rows) -> list[str]:
    lines = ["No speed from zeros: unstructured and N:M rows keep their zeros in dense kernels "
             "(XLA has no sparse matmul on CPU; `jax.experimental.sparse` is not a performance "
             "path), so they decode at the dense speed, within the timing noise; 2:4 pays only on "
             "hardware that reads that layout (sparse tensor cores). Only removing whole heads or "
             "hidden units makes the model smaller and faster here."]
    found = [neuron_line(rows), recovery_line(rows), anchor_line(rows), heads_line(rows)]
    return lines + [line for line in found if line]
