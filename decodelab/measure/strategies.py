"""One decoding strategy read against human text: its continuations of held-out prompts, timed,
and one row of quality metrics (``quality.quality_row``) with what the page needs besides.

A strategy is named by a decode section (``configs/sampling.py``'s ``decode``: ``method`` is
"sample", "beam", "contrastive" or "human", with the fields of ``SamplingParams``, ``generate``'s
guidance (``guidance_scale``, 1: off; ``dola_layers``, "": off), ``beam_search`` and
``contrastive_search`` beside it); the
generator and the scorer come as ``EvaluatedModel`` (a model, its tokenizer and its validation
perplexity), so the row says which models produced and judged the text.

A row keeps its per-prompt sums (``per_prompt``): ``interval`` recomputes a metric from them over
resampled prompts (``RESAMPLED`` says which sums each metric is a statistic of), and ``paired``
compares two strategies prompt by prompt (every strategy continues the same prompts). The
candidate percentiles and the Zipf exponent are pooled over prompts and have no interval.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flax import nnx

from decodelab.measure import quality, stats
from decodelab.sampling.params import SamplingParams

# The programs whose compilations a row counts: jitted function name -> metric name.
PROGRAMS = {"prefill": "compiles_generate_prefill", "_decode_loop": "compiles_generate_loop",
            "beam_prefill": "compiles_beam_prefill", "_beam_loop": "compiles_beam_loop",
            "_target_logprobs": "compiles_scoring", "_token_stats": "compiles_token_stats",
            "contrastive_prefill": "compiles_contrastive_prefill",
            "_contrastive_loop": "compiles_contrastive_loop"}

METHODS = ("sample", "beam", "contrastive", "human")
# The SamplingParams fields a decode section may set (those it holds are passed; the rest keep
# their defaults).
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclasses.dataclass(frozen=True)
class EvaluatedModel:
    """A model with its tokenizer and its perplexity on the validation plays."""

    model: nnx.Module
    tokenizer: Any
    val_ppl: float


def strategy(decode: Any, tokenizer: Any = None) -> quality.Strategy:
    """The strategy a decode section names (its ``method`` and that method's fields);
    ``tokenizer``: for DRY's string breakers."""
    if decode.method == "human":
        return quality.Human()
    if decode.method == "beam":
        return quality.Beam(decode.beam_width, decode.length_penalty, decode.min_new_tokens)
    if decode.method == "contrastive":
        return quality.Contrastive(decode.penalty_alpha, decode.top_k)
    if decode.method == "sample":
        fields = {name: decode[name] for name in SAMPLING_FIELDS if name in decode}
        scale, dola = decode.get("guidance_scale", 1.0), decode.get("dola_layers", "")
        return quality.Sampled(SamplingParams(**fields),
                               guidance_scale=None if scale == 1.0 else scale,
                               dola_layers=dola or None, tokenizer=tokenizer)
    raise ValueError(f"decode.method must be one of {METHODS}, got {decode.method!r}")


def compile_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """The compilations of ``PROGRAMS`` in ``counts`` (``compiles.count_traces``), by metric."""
    return {metric: counts[name] for name, metric in PROGRAMS.items()}


def strategy_row(decode: Any, prompts_cfg: Any, generator: EvaluatedModel,
                 scorer: EvaluatedModel, *, seed: int, improbable_below: float = 0.01,
                 batch_size: int = 32, status: Callable[[str], None] = lambda text: None
                 ) -> dict[str, Any]:
    """The metrics of strategy ``decode`` (named ``decode.name``) on the held-out prompts of
    ``prompts_cfg`` (``per_play``, ``prompt_tokens``, ``new_tokens``, ``samples`` and an optional
    chat ``instruction``; ``quality.held_out_prompts``), continued by the generator with ``seed``
    and scored by both models (``quality.quality_row``, ``per_prompt`` sums included); with the
    seconds spent decoding, both models' validation perplexity and size, and the first prompt
    with its first sample as text. ``status`` is told each stage."""
    tokenizer = generator.tokenizer
    if scorer.tokenizer.vocab_size != tokenizer.vocab_size:
        raise ValueError("generator and scorer must share one tokenizer")
    p = prompts_cfg
    prompts = quality.held_out_prompts(tokenizer, per_document=p.per_play,
                                       prompt_tokens=p.prompt_tokens, new_tokens=p.new_tokens,
                                       instruction=p.get("instruction"))
    method = strategy(decode, tokenizer)
    status("decode")
    start = time.perf_counter()
    drawn = method.decode(generator.model, prompts, new_tokens=p.new_tokens, samples=p.samples,
                          seed=seed, eos_id=tokenizer.eos_id)
    decode_s = time.perf_counter() - start
    status("score")
    row = quality.quality_row(prompts, drawn, tokenizer=tokenizer, generator=generator.model,
                              scorer=scorer.model, params=method.params,
                              improbable_below=improbable_below, batch_size=batch_size)
    return {"strategy": decode.name, **row, "decode_s": decode_s, "prompts": len(prompts),
            "generator_val_ppl": generator.val_ppl, "scorer_val_ppl": scorer.val_ppl,
            "generator_params": generator.model.config.num_params(),
            "scorer_params": scorer.model.config.num_params(),
            "example_prompt": tokenizer.decode(prompts[0].tokens),
            "example": tokenizer.decode(drawn.tokens[0][0])}


# --- Intervals over prompts, from a row's per-prompt sums -----------------------------------------


def one_minus_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return 1.0 - stats.ratio_of_sums(numerator, denominator)


def bits_per_token(nats: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return stats.ratio_of_sums(nats, tokens) / math.log(2)


# How each metric is recomputed from a row's per-prompt sums (quality.quality_row): metric ->
# (statistic, the per_prompt columns it takes).
RESAMPLED = {
    "ppl_generator": (stats.perplexity, ("nll_generator", "tokens")),
    "ppl_scorer": (stats.perplexity, ("nll_scorer", "tokens")),
    "surprise_generator": (bits_per_token, ("nll_generator", "tokens")),
    "surprise_sampled": (stats.ratio_of_sums, ("surprise", "tokens")),
    **{f"distinct_{n}": (stats.ratio_of_sums, (f"distinct_{n}", f"ngram_samples_{n}"))
       for n in (1, 2, 3)},
    "repetition_4": (one_minus_ratio, ("distinct_4", "ngram_samples_4")),
    "self_bleu": (stats.mean, ("self_bleu",)),
    "identical_samples": (stats.mean, ("identical",)),
    "top1_rate": (stats.ratio_of_sums, ("top1", "tokens")),
    "improbable_rate": (stats.ratio_of_sums, ("improbable", "tokens")),
    "mean_length": (stats.ratio_of_sums, ("tokens", "samples")),
    "eos_rate": (stats.ratio_of_sums, ("eos", "samples")),
}


def prompt_columns(m: Mapping[str, Any], metric: str) -> tuple[np.ndarray, ...] | None:
    """The per-prompt columns ``metric`` is a statistic of, or None (no value, or an old row)."""
    per = m.get("per_prompt")
    if metric not in RESAMPLED or per is None or m.get(metric) is None:
        return None
    names = RESAMPLED[metric][1]
    if any(name not in per for name in names) or len(per[names[0]]) < 2:
        return None
    return tuple(np.asarray(per[name], np.float64) for name in names)


def interval(m: Mapping[str, Any], metric: str) -> stats.Interval | None:
    """The 95% interval of ``metric`` over the row's prompts; None without per-prompt values."""
    columns = prompt_columns(m, metric)
    return None if columns is None else stats.bootstrap(RESAMPLED[metric][0], columns)


def shown(m: Mapping[str, Any], metric: str) -> stats.Interval | float | None:
    """``metric`` with its interval where the row has one, else its plain value."""
    return interval(m, metric) or m.get(metric)


def paired(a: Mapping[str, Any], b: Mapping[str, Any], metric: str, *,
           ratio: bool = False) -> stats.Interval | None:
    """``metric`` of strategy ``a`` minus (or over) that of ``b``, paired prompt by prompt; None
    without per-prompt values or where the ratio has no finite value (``b``'s metric is 0)."""
    ca, cb = prompt_columns(a, metric), prompt_columns(b, metric)
    if ca is None or cb is None or len(ca[0]) != len(cb[0]):
        return None
    compare = stats.bootstrap_ratio if ratio else stats.bootstrap_difference
    try:
        return compare(RESAMPLED[metric][0], ca, cb, paired=True)
    except ValueError:
        return None
