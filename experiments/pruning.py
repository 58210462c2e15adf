"""Pruning: weights zeroed (magnitude, Wanda; unstructured and N:M) and heads / hidden units
removed, with and without recovery fine-tuning, judged by KL divergence to the float32 model
(the quantization study's scoreboard) and by decode speed.

    python -m experiments.pruning --config=configs/pruning.py --workdir=runs/pruning
    python -m experiments.report --workdir=runs/pruning --out=results

One point = one candidate: what is removed (``kind``), how (``method`` / ``importance``), how
much (``sparsity`` / ``fraction``), the recovery steps, and the weights' format after pruning.
What each number is:

- the scoreboard (``dl.compare``) of the candidate against the float32 reference on
  ``num_windows`` evenly spaced windows of ``window_tokens + 1`` test-play tokens (``kl_mean``,
  ``kl_p99``, ``same_top``, ``rms_top_prob``, perplexities, ``*_per_window`` for the bootstrap);
  ``parameter_bytes`` at each element's width and ``params`` (parameters, zeros included: a
  zeroed weight is still stored and read).
- ``sparsity``: the fraction of zero weights over the attention and MLP projections, measured on
  the candidate (before any quantization).
- ``tokens_per_s_b<B>``, ``speedup_b<B>``, ``reference_reps_s_b<B>``, ``reps_s_b<B>``: greedy
  ``dl.generate`` of ``new_tokens`` tokens for B prompts, candidate against reference, runs
  interleaved after a warm-up (``experiments/scoreboard.py``).
- ``head_importance`` (head rows): the importance of each key/value head group
  (``head_importance``), and ``heads_kept``: 1 for each query head kept, 0 for one removed; each
  a dict of one list per layer (``by_layer``; ``layers`` gives ``[L, K]`` and ``[L, N]``).
- ``recovery_loss``: the recovery run's training loss at each step (recovered rows).
- ``load_1min``: the machine's 1-minute load average when the point started.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
from absl import app
from matplotlib.figure import Figure

import decodelab as dl
from decodelab import experiment
from decodelab import report as results
from decodelab.compress.pruning import (head_importance, heads_to_keep, prune_heads, prune_neurons,
                                        sparsity_of, update_mask)
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets
from decodelab.measure import stats
from decodelab.text import data
from decodelab.text.data import token_windows
from decodelab.train.trainer import TrainConfig, train
from experiments.scoreboard import (cached, cell, reference_key, speed_cell, speed_judged,
                                    swap_candidate, time_decoding, times)

_FLAGS = experiment.define_flags("configs/pruning.py")

ANCHORS = """**Published anchors** (Wanda README, Llama-2-7B, wikitext-2 perplexity; not rerun
here): dense 5.12; 50% unstructured: magnitude 14.89, SparseGPT 6.51, Wanda 6.42; 2:4: magnitude
54.59, SparseGPT 10.17, Wanda 11.02; 4:8: magnitude 16.48, Wanda 7.97."""

SPARSE_NOTE = """**No speed from zeros.** Unstructured and N:M rows hold their zeros in dense
kernels: XLA has no sparse matmul on CPU and `jax.experimental.sparse` is not a performance path,
so they read and multiply every weight and decode at the dense speed (their speed-ups sit at 1
within the timing noise). 2:4 pays off only on hardware that reads that layout (sparse tensor
cores). Only removing whole heads or hidden units makes the model smaller and faster here."""


def _label(config) -> str:
    kind = config.kind
    if kind == "dense":
        base = "dense"
    elif kind == "unstructured":
        base = f"{config.method} {round(100 * config.sparsity)}%"
    elif kind in ("2:4", "4:8"):
        base = f"{config.method} {kind}"
    else:
        base = f"{kind} -{round(100 * config.fraction)}% ({config.importance})"
    weights = {"": "", "int8-w8a8": "int8 W8A8", "int4-g32": "int4 g32"}[config.weights]
    parts = [weights] if base == "dense" and weights else [base] + ([weights] if weights else [])
    if config.recovery_steps:
        parts.append(f"{config.recovery_steps} recovery steps")
    return " + ".join(parts)


def _check(config) -> None:
    kinds = ("dense", "unstructured", "2:4", "4:8", "heads", "neurons")
    if config.kind not in kinds:
        raise ValueError(f"config.kind must be one of {kinds}, got {config.kind!r}")
    if config.weights not in ("", "int8-w8a8", "int4-g32"):
        raise ValueError(f"config.weights must be '', 'int8-w8a8' or 'int4-g32', got "
                         f"{config.weights!r}")
    if config.recovery_steps and presets.is_pretrained(config.model):
        raise ValueError("config.recovery_steps must be 0 for a pretrained model (recovery "
                         "trains on this corpus, which would change what the model is)")


def _recover(model, tokenizer, config, ctx):
    """``recovery_steps`` steps of training on the corpus with the pruned weights held at zero."""
    fields = {**config.recovery.to_dict(), "steps": config.recovery_steps,
              "checkpoint_every": config.recovery_steps, "log_every": 1}
    result = train(model.config, TrainConfig(**fields), data.token_stream(tokenizer, "train"),
                   init=model, update_mask=update_mask(model), progress=ctx.show_progress)
    return result.model, [h["loss"] for h in result.history]


def _build(config, model, tokenizer, calibration, ctx) -> tuple:
    """``(candidate, extra row fields)`` of the point."""
    extra: dict = {}
    kind = config.kind
    if kind == "dense":
        candidate = model
    elif kind in ("unstructured", "2:4", "4:8"):
        candidate = dl.prune(model, config.method, config.sparsity, pattern=kind,
                             calibration=calibration if config.method == "wanda" else None)
    else:
        calib = calibration if config.importance == "taylor" else None
        if kind == "heads":
            keep = heads_to_keep(model, config.fraction, config.importance, calib)
            extra["heads_kept"] = by_layer(np.asarray(keep, np.int32))
            extra["head_importance"] = by_layer(head_importance(model, config.importance, calib))
            candidate = prune_heads(model, config.fraction, importance=config.importance,
                                          calibration=calib)
        else:
            candidate = prune_neurons(model, config.fraction,
                                            importance=config.importance, calibration=calib)
    if config.recovery_steps:
        ctx.status("recovery")
        candidate, extra["recovery_loss"] = _recover(candidate, tokenizer, config, ctx)
    zeros = sparsity_of(candidate)
    extra["sparsity"] = float(np.mean(list(zeros.values())))
    extra["params"] = dl.param_count(candidate)
    if config.weights == "int8-w8a8":
        candidate = dl.quantize(candidate, weights="int8", activations="int8")
    elif config.weights == "int4-g32":
        candidate = dl.quantize(candidate, weights="int4", group_size=32)
    return candidate, extra


def evaluate(config, ctx) -> dict:
    load = os.getloadavg()[0]
    _check(config)
    model, tokenizer = cached(reference_key(config), lambda: pipeline.model_for(
        config.tokenizer, config.model, config.train, ctx.workdir, progress=ctx.show_progress))
    calibration = token_windows(tokenizer, "train", config.calibration_windows,
                                config.window_tokens)
    ctx.status("prune")
    key = tuple(config[k] for k in ("kind", "method", "sparsity", "fraction", "importance",
                                    "recovery_steps", "weights"))
    candidate, extra = swap_candidate(key, lambda: _build(config, model, tokenizer, calibration,
                                                          ctx))
    ctx.status("scoreboard")
    windows = token_windows(tokenizer, "test", config.num_windows, config.window_tokens + 1)
    board = dl.compare(model, candidate, windows)
    row = {"label": _label(config), "load_1min": load, **board.as_dict(), **extra,
           "parameter_bytes": board.parameter_bytes_candidate}
    prompts = token_windows(tokenizer, "test", max(config.batch_sizes),
                            config.prompt_tokens).tolist()
    row.update(time_decoding(model, candidate, prompts, config, ctx))
    return row


# --- The page -------------------------------------------------------------------------------------


def _m(row, name):
    return row["metrics"].get(name)


def _find(rows, **where):
    return next((r for r in rows if all(r["config"].get(k) == v for k, v in where.items())), None)


def _table(rows) -> results.Table:
    columns = ["candidate", "params (M)", "param MB", "sparsity", "mean KLD", "p99 KLD",
               "same top %", "ppl", "ppl diff", "tok/s b1", "speed-up b1", "tok/s b8",
               "speed-up b8"]
    body = [[_m(r, "label"), _m(r, "params") / 1e6, _m(r, "parameter_bytes") / 1e6,
             _m(r, "sparsity"), cell(r, "kl_mean"), _m(r, "kl_p99"), cell(r, "same_top"),
             _m(r, "perplexity_candidate"), _m(r, "perplexity_diff"), _m(r, "tokens_per_s_b1"),
             speed_cell(r, 1), _m(r, "tokens_per_s_b8"), speed_cell(r, 8)] for r in rows]
    return results.Table(columns, body)


def _curves(rows, path: pathlib.Path) -> pathlib.Path:
    """Mean KL divergence and perplexity against sparsity, one line per method and recovery."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    dense = _find(rows, kind="dense", weights="")
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
            axes[0].errorbar(x, [k.value if isinstance(k, stats.Interval) else k for k in kl],
                             yerr=_bars(kl), capsize=3, **style)
            axes[1].plot(x, [_m(r, "perplexity_candidate") for r in group], **style)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean KL divergence to the dense model (nats)")
    axes[1].set_ylabel("perplexity (test windows)")
    if dense is not None:
        axes[1].axhline(_m(dense, "perplexity_reference"), color="grey", linewidth=0.8,
                        label="dense")
    for ax in axes:
        ax.set_xlabel("unstructured sparsity (%)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _bars(values) -> list[list[float]]:
    """Error-bar lengths below and above for a list of Intervals (0 for plain numbers)."""
    low = [v.value - v.low if isinstance(v, stats.Interval) else 0.0 for v in values]
    high = [v.high - v.value if isinstance(v, stats.Interval) else 0.0 for v in values]
    return [low, high]


def by_layer(array) -> dict[str, list]:
    """``[L, X]`` as a row's per-unit metric: ``{"0": [...], "1": [...], ...}``, one list per
    layer (a row holds numbers, lists of numbers or dicts of lists)."""
    return {str(layer): np.asarray(values).tolist() for layer, values in enumerate(array)}


def layers(metric: dict[str, list]) -> np.ndarray:
    """``by_layer``'s dict back as ``[L, X]``."""
    return np.asarray([metric[key] for key in sorted(metric, key=int)])


def _heads_plot(row, path: pathlib.Path) -> pathlib.Path:
    """Importance of each layer's key/value head groups, the removed ones marked."""
    importance = layers(_m(row, "head_importance"))  # [L, K]
    kept = layers(_m(row, "heads_kept")).astype(bool)  # [L, N]
    L, K = importance.shape
    removed = ~kept.reshape(L, K, -1)[:, :, 0]
    fig = Figure(figsize=(1.2 * K + 2.5, 0.45 * L + 1.5), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(importance, cmap="viridis", aspect="auto")
    for layer, group in zip(*np.nonzero(removed)):
        ax.text(group, layer, "x", ha="center", va="center", color="red", fontsize=12)
    ax.set_xlabel("key/value head group")
    ax.set_ylabel("layer")
    ax.set_title(f"{row['config']['importance']} importance (x: removed)", fontsize=10)
    fig.colorbar(image, ax=ax)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _kl_difference(a, b) -> str:
    """Mean KLD of row ``a`` minus row ``b``, paired over the windows, with its verdict."""
    wa, wb = _m(a, "kl_per_window"), _m(b, "kl_per_window")
    if not wa or not wb or len(wa) != len(wb) or len(wa) < 2:
        return "not judged (the rows keep no per-window values)"
    difference = stats.bootstrap_difference(stats.mean, np.asarray(wa, np.float64),
                                            np.asarray(wb, np.float64))
    verdict = results.verdict(difference, above="higher", below="lower", units="windows")
    return f"{difference:+.3g} ({verdict})"


def _method_pair(rows, kind: str, sparsity: float):
    """The Wanda and the magnitude row of one pattern (no recovery, float weights), or Nones."""
    where = dict(kind=kind, recovery_steps=0, weights="")
    if kind == "unstructured":
        where["sparsity"] = sparsity
    return _find(rows, method="wanda", **where), _find(rows, method="magnitude", **where)


def _wanda_vs_magnitude(rows) -> list[str]:
    lines = []
    for kind, sparsity in [("unstructured", s) for s in (0.1, 0.3, 0.5, 0.7)] + [
            ("2:4", 0.5), ("4:8", 0.5)]:
        wanda, magnitude = _method_pair(rows, kind, sparsity)
        if wanda is None or magnitude is None:
            continue
        name = f"{round(100 * sparsity)}%" if kind == "unstructured" else kind
        lines.append(f"- {name}: mean KLD Wanda {cell(wanda, 'kl_mean'):.3g}, magnitude "
                     f"{cell(magnitude, 'kl_mean'):.3g}; Wanda minus magnitude "
                     f"{_kl_difference(wanda, magnitude)}; perplexity "
                     f"{_m(wanda, 'perplexity_candidate'):.2f} vs "
                     f"{_m(magnitude, 'perplexity_candidate'):.2f} (dense "
                     f"{_m(wanda, 'perplexity_reference'):.2f}).")
    return lines


# Llama-2-7B, wikitext-2 perplexity (the Wanda README): dense, then magnitude and Wanda per pattern.
ANCHOR_PPL = {"dense": 5.12, "50%": (14.89, 6.42), "2:4": (54.59, 11.02), "4:8": (16.48, 7.97)}


def _against_anchors(rows) -> str | None:
    """Perplexity added over the dense model by magnitude and by Wanda, here and at 7B."""
    parts = []
    for name, kind, sparsity in (("50%", "unstructured", 0.5), ("2:4", "2:4", 0.5),
                                 ("4:8", "4:8", 0.5)):
        wanda, magnitude = _method_pair(rows, kind, sparsity)
        if wanda is None or magnitude is None:
            continue
        dense = _m(wanda, "perplexity_reference")
        here = (_m(magnitude, "perplexity_candidate") - dense,
                _m(wanda, "perplexity_candidate") - dense)
        anchor = tuple(a - ANCHOR_PPL["dense"] for a in ANCHOR_PPL[name])
        parts.append(f"{name}: magnitude +{here[0]:.2f}, Wanda +{here[1]:.2f} over dense "
                     f"{dense:.2f} here (Wanda adds {here[1] / here[0]:.0%} of magnitude's "
                     f"increase); at 7B magnitude +{anchor[0]:.2f}, Wanda +{anchor[1]:.2f} over "
                     f"{ANCHOR_PPL['dense']} ({anchor[1] / anchor[0]:.0%})")
    if not parts:
        return None
    return ("**Against the 7B anchors** (perplexity added by pruning, without recovery): "
            + "; ".join(parts) + ".")


def _heads_removed(row) -> str | None:
    """Which key/value head groups each layer lost, and where they ranked."""
    if row is None or not _m(row, "heads_kept"):
        return None
    importance = layers(_m(row, "head_importance"))  # [L, K]
    kept = layers(_m(row, "heads_kept")).astype(bool)  # [L, N]
    L, K = importance.shape
    removed = ~kept.reshape(L, K, -1)[:, :, 0]
    ranks = np.argsort(np.argsort(-importance, axis=1), axis=1)  # 0: the most important
    per_layer = [f"layer {layer}: group{'s' if removed[layer].sum() > 1 else ''} "
                 + ", ".join(str(g) for g in np.nonzero(removed[layer])[0])
                 for layer in range(L)]
    lowest = all(set(np.nonzero(removed[layer])[0]) == set(np.argsort(importance[layer])[
        :removed[layer].sum()]) for layer in range(L))
    spread = importance.max(axis=1) / np.maximum(importance.min(axis=1), 1e-30)
    return (f"**Which heads go first** ({_m(row, 'label')}): " + "; ".join(per_layer)
            + f" ({'each layer' if lowest else 'not every layer'} lost its least important "
            f"groups by {row['config']['importance']} importance; the most important group of a "
            f"layer scores {spread.min():.1f}x to {spread.max():.1f}x its least, and ranks "
            f"{np.mean(ranks[removed]):.1f} on average among the {K} groups, 0 the top).")


def _recovery(rows) -> list[str]:
    """Each recovered row against the same pruning without recovery: KLD paired over the windows
    and perplexity (recovery trains on the corpus, so it can lower perplexity while moving the
    model away from the reference it is scored against)."""
    lines = []
    for r in rows:
        c = r["config"]
        if not c["recovery_steps"] or (c["kind"] == "dense" and not c["weights"]):
            continue  # the steps alone: the last line's baseline
        twin = next((t for t in rows if t["config"]["recovery_steps"] == 0 and all(
            t["config"].get(k) == c.get(k) for k in ("kind", "method", "sparsity", "fraction",
                                                      "importance", "weights"))), None)
        if twin is None:
            continue
        lines.append(f"- {_m(r, 'label')}: mean KLD {cell(r, 'kl_mean'):.3g} against "
                     f"{cell(twin, 'kl_mean'):.3g} without recovery, difference "
                     f"{_kl_difference(r, twin)}; perplexity "
                     f"{_m(r, 'perplexity_candidate'):.2f} against "
                     f"{_m(twin, 'perplexity_candidate'):.2f} (dense "
                     f"{_m(r, 'perplexity_reference'):.2f}).")
    if lines:
        pairs = [(r, t) for r in rows if r["config"]["recovery_steps"] and not (
                     r["config"]["kind"] == "dense" and not r["config"]["weights"]) for t in rows
                 if t["config"]["recovery_steps"] == 0 and all(
                     t["config"].get(k) == r["config"].get(k)
                     for k in ("kind", "method", "sparsity", "fraction", "importance", "weights"))]
        lower_kl = sum(_m(r, "kl_mean") < _m(t, "kl_mean") for r, t in pairs)
        lower_ppl = sum(_m(r, "perplexity_candidate") < _m(t, "perplexity_candidate")
                        for r, t in pairs)
        alone = _find(rows, kind="dense", recovery_steps=pairs[0][0]["config"]["recovery_steps"],
                      weights="")
        steps = ("" if alone is None else
                 f" The same steps on the unpruned model move it to mean KLD "
                 f"{cell(alone, 'kl_mean'):.3g} (perplexity {_m(alone, 'perplexity_candidate'):.2f}"
                 f"): that is what recovery costs by itself, so it pays only where pruning cost "
                 f"more.")
        lines.append(f"- In all: recovery lowered the mean KLD in {lower_kl} of {len(pairs)} "
                     f"pairs and the perplexity in {lower_ppl}. Recovery trains on the corpus, "
                     f"not towards the reference, so it moves the model away from the reference "
                     f"by itself.{steps} Recovery by distillation from the dense model (its "
                     f"logits as targets) would aim at the scoreboard itself.")
    return lines


def _speed_per_kl(rows) -> list[str]:
    """Structured removal and quantization: the speed-up at batch 1 bought per nat of mean KL
    divergence, ``(speed-up - 1) / KLD``."""
    lines = []
    for r in rows:
        c = r["config"]
        if c["recovery_steps"] or not (c["kind"] in ("heads", "neurons") or c["weights"]):
            continue
        kl, speed = _m(r, "kl_mean"), _m(r, "speedup_b1")
        if kl is None or speed is None or kl <= 0:
            continue
        lines.append(f"- {_m(r, 'label')}: {times(speed_cell(r, 1))} at batch 1 for mean KLD "
                     f"{kl:.3g}: {(speed - 1) / kl:+.3g} speed-up per nat.")
    return lines


def _targets(rows) -> str:
    lines = []
    for r in rows:
        c = r["config"]
        if c["kind"] in ("unstructured", "2:4", "4:8") and not c["weights"]:
            want = c["sparsity"] if c["kind"] == "unstructured" else 0.5
            if abs(_m(r, "sparsity") - want) > 1e-3:
                lines.append(f"- {_m(r, 'label')}: measured sparsity {_m(r, 'sparsity'):.4f} "
                             f"against {want}.")
    exact = ("- Requested sparsity: every unstructured and N:M row holds it (measured over the "
             "projections; per matrix and per N:M group it is tested exactly in "
             "`tests/test_prune.py`)." if not lines else "\n".join(lines))
    neurons = _find(rows, kind="neurons", fraction=0.25, recovery_steps=0, weights="")
    out = [exact]
    if neurons is not None:
        out.append(f"- 25% of hidden units removed: decode at batch 1 "
                   f"{times(speed_cell(neurons, 1))} the dense model's (target >= 1.15x: "
                   f"{speed_judged(neurons, 1.15)}), mean KLD {cell(neurons, 'kl_mean'):.3g}, same "
                   f"top {cell(neurons, 'same_top'):.4g}%.")
        dense = _find(rows, kind="dense", recovery_steps=0, weights="")
        if dense is not None:
            ceiling = _m(dense, "parameter_bytes") / _m(neurons, "parameter_bytes")
            out.append(f"  Its ceiling: it removes {1 - 1 / ceiling:.1%} of the parameter bytes "
                       f"({_m(dense, 'parameter_bytes') / 1e6:.1f} to "
                       f"{_m(neurons, 'parameter_bytes') / 1e6:.1f} MB), so a step bound by "
                       f"reading its weights gains at most {ceiling:.2f}x; reading the KV cache and "
                       f"each step's fixed costs do not shrink, so the gain is less.")
    wall = sum(r.get("wall_time_s", 0.0) for r in rows)
    out.append(f"- The study's points took {wall / 60:.0f} minutes in all (target: under 90).")
    return "\n".join(out)


def report(rows, out_dir) -> list[pathlib.Path]:
    """One page per reference model: ``pruning.md`` (medium) or ``pruning_<preset>.md``."""
    out_dir = pathlib.Path(out_dir)
    groups: dict = {}
    for row in sorted(rows, key=lambda r: r.get("sweep_index", 0)):  # sweep order
        groups.setdefault(row["config"]["model"].get("pretrained"), []).append(row)
    written = []
    for pretrained, group in groups.items():
        name = "pruning" + ("" if pretrained is None else f"_{pretrained}")
        c = group[0]["config"]
        model = (f"`medium` ({c['model']['d_model']} wide, {c['model']['n_layers']} layers) "
                 f"trained on the corpus for {c['train']['steps']} steps" if pretrained is None else
                 f"the pretrained `{pretrained}` (its GGUF file dequantized to float32)")
        page = results.Page(f"Pruning: {model}", group)
        page.text(
            f"Reference: {model}. Scoreboard (`dl.compare`) on {c['num_windows']} windows of "
            f"{c['window_tokens']} held-out tokens; Wanda and Taylor importance calibrated on "
            f"{c['calibration_windows']} training windows of {c['window_tokens']} tokens; "
            f"recovery: {c['recovery']['steps']} steps of {c['recovery']['batch_size']} x "
            f"{c['recovery']['seq_len']} tokens at peak learning rate "
            f"{c['recovery']['learning_rate']:g}, pruned weights held at zero; decode speed: "
            f"greedy `dl.generate` of {c['new_tokens']} tokens, medians of {c['repeats']} runs "
            f"interleaved with the dense model. Brackets: 95% bootstrap intervals over the "
            f"windows (scoreboard) and over the timed runs (speed-ups). See "
            f"`experiments/pruning.py` for every column.")
        page.text("**Targets.**\n" + _targets(group))
        reading = _wanda_vs_magnitude(group)
        if reading:
            page.text("**Wanda against magnitude** (no recovery; paired over the windows):\n"
                      + "\n".join(reading))
        recovered = _recovery(group)
        if recovered:
            page.text("**Recovery against none** (the same pruning; KLD paired over the "
                      "windows):\n" + "\n".join(recovered))
        speed = _speed_per_kl(group)
        if speed:
            page.text("**Speed bought per unit of KL divergence** (no recovery):\n"
                      + "\n".join(speed))
        anchors = _against_anchors(group)
        if anchors:
            page.text(anchors)
        removed = _heads_removed(_find(group, kind="heads", fraction=0.25, recovery_steps=0))
        if removed:
            page.text(removed)
        page.table(_table(group), out_dir / f"{name}.csv", number_format="{:.4g}")
        page.image(_curves(group, out_dir / f"{name}.png"),
                   "KL divergence and perplexity against sparsity")
        heads = _find(group, kind="heads", fraction=0.25, recovery_steps=0)
        extra = []
        if heads is not None and _m(heads, "head_importance"):
            extra.append(_heads_plot(heads, out_dir / f"{name}_heads.png"))
            page.image(extra[-1], "head group importance per layer; the removed groups marked")
        page.text(SPARSE_NOTE)
        page.text(ANCHORS)
        written += [page.write(out_dir / f"{name}.md"), out_dir / f"{name}.csv",
                    out_dir / f"{name}.png", *extra]
    return written


def main(argv) -> None:
    del argv
    experiment.run_from_flags(_FLAGS, evaluate)


if __name__ == "__main__":
    app.run(main)
