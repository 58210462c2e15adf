"""Text quality of decoding strategies: held-out prompts with their true continuations, each
strategy's samples, and one row of metrics that reads a strategy against human text.

Conventions (every caller relies on them):

- A prompt is ``prompt_tokens`` tokens of a held-out document, starting at a paragraph; its
  *reference* is the true next ``new_tokens`` tokens (the human continuation, cut at the same
  budget as the samples, so lengths compare). For an instruct model the prompt may instead be a
  chat: a user turn holding an instruction and the text of those tokens, then the start of the
  assistant's turn; the reference stays the document's true continuation.
- A strategy continues each of ``P`` prompts ``samples`` times; sample ``j`` of prompt ``i`` is row
  ``j * P + i`` of one batch under the int ``seed``, so it draws from ``fold_in(key(seed), row)``.
  Greedy decoding repeats itself across seeds; beam search is run once and its best hypothesis
  stands for every sample; the human strategy has one sample per prompt, its reference.
- A continuation stops after an EOS id (kept) or at ``new_tokens``.
- Token statistics (``top1_rate``, ``improbable_rate``, ``candidates_*``) are measured at every
  continuation token under the *generating* model's raw distribution (before any processor), and
  the candidates are the tokens the strategy's processors leave allowed there, recomputed from a
  full forward pass over prompt + continuation.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab import sampling
from decodelab.cache import bucket_length
from decodelab.checks import check_int, position_limit
from decodelab.decode.beam import beam_search
from decodelab.decode.contrastive import contrastive_search
from decodelab.decode.generation import generate
from decodelab.decode.request import BeamOptions, DecodeOptions
from decodelab.measure import perplexity as metrics
from decodelab.model.losses import token_nll
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.processors import HISTORY_PARAMETERS
from decodelab.text import data


@dataclasses.dataclass(frozen=True)
class HeldOutPrompt:
    """A prompt from a held-out document and the document's true continuation of it."""

    document: str
    tokens: list[int]
    reference: list[int]


def held_out_prompts(tokenizer: Any, *, per_document: int, prompt_tokens: int, new_tokens: int,
                     split: str = "test", instruction: str | None = None) -> list[HeldOutPrompt]:
    """``per_document`` prompts from each document of ``split`` (sorted by name), starting at the
    first paragraph after ``10% + 80% (k + 0.5) / per_document`` of the text, k = 0, 1, ...

    With an ``instruction``, each prompt is the tokenizer's chat template (a
    ``PretrainedTokenizer``'s ``apply_chat_template``) of one user message, the instruction, a
    blank line and the prompt's text, ready for the assistant's reply."""
    if instruction is not None and not (isinstance(instruction, str) and instruction.strip()):
        raise ValueError(f"instruction must be None or a non-empty str, got {instruction!r}")
    for name, value in (("per_document", per_document), ("prompt_tokens", prompt_tokens),
                        ("new_tokens", new_tokens)):
        check_int(name, value, 1)
    prompts = []
    for name, text in sorted(data.split_documents(split).items()):
        for k in range(per_document):
            at = int(len(text) * (0.1 + 0.8 * (k + 0.5) / per_document))
            start = text.find("\n\n", at) + 2 if "\n\n" in text[at:] else at
            # ~4 characters per token on this corpus; 50 per token leaves a wide margin.
            ids = list(tokenizer.encode(text[start:start + 50 * (prompt_tokens + new_tokens)]))
            tokens = ids[:prompt_tokens]
            if instruction is not None:
                tokens = tokenizer.encode(tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"{instruction}\n\n{tokenizer.decode(tokens)}"}]))
            prompts.append(HeldOutPrompt(name, tokens,
                                         ids[prompt_tokens:prompt_tokens + new_tokens]))
    return prompts


# --- Strategies -----------------------------------------------------------------------------------


class Drawn(NamedTuple):
    """What a strategy made: ``tokens[i][j]``, sample j of prompt i, and where the strategy draws
    its tokens, ``logprobs[i][j]``, each token's log-probability (nats) under the distribution it
    was drawn from (else None)."""

    tokens: list[list[list[int]]]
    logprobs: list[list[list[float]]] | None = None


class Strategy(abc.ABC):
    """How the continuations of a set of prompts are made."""

    @abc.abstractmethod
    def decode(self, model: nnx.Module, prompts: Sequence[HeldOutPrompt], *, new_tokens: int,
               samples: int, seed: int, eos_id: int) -> Drawn:
        """The ``[prompt][sample]`` token lists, with what they were drawn from (``Drawn``)."""

    def continuations(self, model: nnx.Module, prompts: Sequence[HeldOutPrompt], *,
                      new_tokens: int, samples: int, seed: int,
                      eos_id: int) -> list[list[list[int]]]:
        """``[prompt][sample]`` token lists."""
        return self.decode(model, prompts, new_tokens=new_tokens, samples=samples, seed=seed,
                           eos_id=eos_id).tokens

    @property
    def params(self) -> SamplingParams | None:
        """The sampling parameters whose allowed set the candidates count, if any."""
        return None


def _by_prompt(rows: Sequence[Any], P: int, samples: int) -> list[list[Any]]:
    """Row ``j * P + i`` of a batch as sample j of prompt i."""
    return [[rows[j * P + i] for j in range(samples)] for i in range(P)]


@dataclasses.dataclass(frozen=True)
class Sampled(Strategy):
    """``generate`` with these sampling parameters (temperature 0: greedy), and optionally
    classifier-free guidance at ``guidance_scale`` against each prompt's last token (an empty
    negative prompt: transformers' default), or DoLa over ``dola_layers``; ``tokenizer`` (for
    DRY's string breakers) goes to ``DecodeOptions`` only where the parameters need it."""

    sampling_params: SamplingParams
    guidance_scale: float | None = None
    dola_layers: str | None = None
    tokenizer: Any = None

    @property
    def params(self) -> SamplingParams | None:
        # Under CFG or DoLa the kept set is not the processors' on the model's logits.
        guided = self.guidance_scale is not None or self.dola_layers is not None
        return None if guided else self.sampling_params

    def decode(self, model, prompts, *, new_tokens, samples, seed, eos_id):
        P = len(prompts)
        rows = [p.tokens for _ in range(samples) for p in prompts]  # row j * P + i
        dry = np.any(np.asarray(self.sampling_params.dry_multiplier) != 0)
        options = DecodeOptions(
            eos_ids=[eos_id], tokenizer=self.tokenizer if dry else None,
            guidance_scale=self.guidance_scale, dola_layers=self.dola_layers,
            negative_prompts=None if self.guidance_scale is None else [[] for _ in rows])
        out = generate(model, rows, self.sampling_params, new_tokens, seed=seed,
                       options=options)
        lists = out.token_lists()
        logprobs = [out.logprobs[b, :len(tokens)].astype(np.float64).tolist()
                    for b, tokens in enumerate(lists)]
        return Drawn(_by_prompt(lists, P, samples), _by_prompt(logprobs, P, samples))


@dataclasses.dataclass(frozen=True)
class Contrastive(Strategy):
    """``contrastive_search`` (deterministic: run once, its continuation stands for every
    sample)."""

    penalty_alpha: float
    top_k: int

    def decode(self, model, prompts, *, new_tokens, samples, seed, eos_id):
        del seed  # deterministic
        out = contrastive_search(model, [p.tokens for p in prompts], self.penalty_alpha,
                                 self.top_k, new_tokens, options=DecodeOptions(eos_ids=[eos_id]))
        return Drawn([[tokens] * samples for tokens in out.token_lists()])


@dataclasses.dataclass(frozen=True)
class Beam(Strategy):
    """``beam_search`` of this width and length penalty; its best hypothesis for every sample."""

    width: int
    length_penalty: float
    min_new_tokens: int = 0

    def decode(self, model, prompts, *, new_tokens, samples, seed, eos_id):
        del seed  # deterministic
        out = beam_search(model, [p.tokens for p in prompts], self.width, new_tokens,
                          length_penalty=self.length_penalty,
                          options=BeamOptions(num_return=1, eos_ids=[eos_id],
                                              min_new_tokens=self.min_new_tokens))
        return Drawn([[best] * samples for best in out.best()])


@dataclasses.dataclass(frozen=True)
class Human(Strategy):
    """The true continuation: one sample per prompt."""

    def decode(self, model, prompts, *, new_tokens, samples, seed, eos_id):
        return Drawn([[list(p.reference)] for p in prompts])


# --- Token statistics under the generating model --------------------------------------------------


@functools.partial(jax.jit, static_argnames=("graphdef", "width"))
def _token_stats(weights, inputs, starts, targets, params, *, graphdef, width):
    """At ``width`` continuation positions per row (from ``starts[b]``): the raw log-probability of
    the target, whether it is the argmax, and how many tokens ``params``' processors allow.

    inputs: [B, T] prompt + continuation; targets: [B, width], the continuation tokens."""
    model = nnx.merge(graphdef, weights)
    logits = model(inputs)  # [B, T, V]
    B, T, V = logits.shape
    at = jnp.clip(starts[:, None] + jnp.arange(width)[None, :], 0, T - 1)  # [B, N]
    logits = jnp.take_along_axis(logits, at[:, :, None], axis=1)  # [B, N, V]
    chosen = -token_nll(logits, targets)  # [B, N]
    top1 = jnp.argmax(logits, axis=-1) == targets
    flat = jax.tree.map(lambda x: jnp.repeat(x, width, axis=0), params)  # [B * N] per field
    history = sampling.History(tokens=jnp.zeros((B * width, 1), jnp.int32),
                               prompt_lengths=jnp.zeros((B * width,), jnp.int32),
                               lengths=jnp.zeros((B * width,), jnp.int32),
                               eos_mask=jnp.zeros((V,), bool))
    processed = sampling.process_logits(logits.reshape(B * width, V), flat, history)
    kept = jnp.sum(processed > -jnp.inf, axis=-1).reshape(B, width)
    return chosen, top1, kept


def token_stats(model: nnx.Module, prompts: Sequence[Sequence[int]],
                continuations: Sequence[Sequence[int]], params: SamplingParams | None, *,
                batch_size: int = 32) -> dict[str, np.ndarray]:
    """Per continuation token, pooled over all continuations: ``logprob`` (raw, under ``model``),
    ``top1`` (the token is the model's argmax) and, with ``params`` free of history-dependent
    processors, ``candidates`` (tokens its processors allow at that step)."""
    # A strategy using a processor that looks at the tokens so far, or a constraint, has no
    # candidate count recomputed from a forward pass (its allowed set depends on the history).
    if params is not None and (params.constrained or any(
            np.any(np.asarray(getattr(params, name)) != p.neutral)
            for name, p in HISTORY_PARAMETERS.items())):
        params = None
    # Power-of-two padding, as for prompts, so continuations of new lengths reuse the program.
    width = bucket_length(max(1, max(len(c) for c in continuations)), minimum=1)
    longest = max(len(p) + len(c) for p, c in zip(prompts, continuations))
    T = bucket_length(longest)
    limit = position_limit(model)
    T = min(T, limit) if limit else T
    row_params = (params or SamplingParams()).per_row(batch_size, model.config.vocab_size)
    graphdef, weights = nnx.split(model)
    pooled = {"logprob": [], "top1": [], "candidates": []}
    for start in range(0, len(prompts), batch_size):
        pairs = list(zip(prompts, continuations))[start:start + batch_size]
        inputs = np.zeros((batch_size, T), np.int32)
        targets = np.zeros((batch_size, width), np.int32)
        starts = np.zeros((batch_size,), np.int32)
        for row, (p, c) in enumerate(pairs):
            sequence = list(p) + list(c)
            inputs[row, :len(sequence) - 1] = sequence[:-1]
            targets[row, :len(c)] = c
            starts[row] = len(p) - 1
        chosen, top1, kept = jax.device_get(_token_stats(
            weights, inputs, starts, targets, row_params, graphdef=graphdef, width=width))
        for row, (_, c) in enumerate(pairs):
            pooled["logprob"].append(chosen[row, :len(c)].astype(np.float64))
            pooled["top1"].append(top1[row, :len(c)])
            pooled["candidates"].append(kept[row, :len(c)])
    stats = {k: np.concatenate(v) for k, v in pooled.items()}
    if params is None:
        del stats["candidates"]
    return stats


# --- The row --------------------------------------------------------------------------------------


def quality_row(prompts: Sequence[HeldOutPrompt],
                samples: Sequence[Sequence[Sequence[int]]] | Drawn, *, tokenizer: Any,
                generator: nnx.Module, scorer: nnx.Module | None = None,
                params: SamplingParams | None = None, improbable_below: float = 0.01,
                batch_size: int = 32) -> dict[str, float | int | None]:
    """The metrics of ``samples[i][j]`` (sample j of prompt i; see ``metrics``; or a ``Drawn``): perplexity under
    the generator and the scorer, distinct-1/2/3, repetition of 4-grams, self-BLEU (mean over
    prompts with at least 2 samples; None without) and the share of such prompts whose samples
    are all the same tokens, Zipf coefficient, mean length, EOS rate, and
    the generator's token statistics (``token_stats``): top-1 rate, share of tokens below
    ``improbable_below`` probability, and the 10th / 50th / 90th percentile and mean of the number
    of candidates (with ``params``); the mean surprise in bits of the tokens under the generator
    (``surprise_generator``) and, where ``samples`` is a ``Drawn`` with its ``logprobs``
    (``Strategy.decode`` gives it), under the distributions drawn from (``surprise_sampled``: what
    Mirostat steers to its tau).

    ``per_prompt`` holds, for each prompt in order, the sums the pooled metrics are ratios of, so
    that a bootstrap over prompts can recompute them (``decodelab.measure.stats``): ``samples``,
    ``tokens``, ``eos`` (samples ending in EOS), ``nll_generator`` / ``nll_scorer`` (nats over the
    prompt's sample tokens), ``top1`` and ``improbable`` (token counts), ``distinct_n`` (sum over
    the prompt's samples of their distinct-n ratio) and ``ngram_samples_n`` (how many samples have
    an n-gram) for n = 1..4, and, where the prompt has several samples, ``self_bleu`` and
    ``identical`` (1 if they are all the same tokens), and with ``logprobs``, ``surprise`` (bits
    over the prompt's sample tokens, under the distributions drawn from). Each metric of the row
    is its ratio of these sums over all prompts (``mean_length`` = tokens / samples,
    ``repetition_4`` = 1 - the distinct-4 ratio)."""
    samples, logprobs = samples if isinstance(samples, Drawn) else (samples, None)
    if len(samples) != len(prompts):
        raise ValueError(f"samples must hold one list per prompt, got {len(samples)} for "
                         f"{len(prompts)} prompts")
    if logprobs is not None and [[len(lp) for lp in group] for group in logprobs] != [
            [len(s) for s in group] for group in samples]:
        raise ValueError("samples.logprobs must hold one value per token of samples.tokens, in "
                         "their shape")
    if not 0 < improbable_below < 1:
        raise ValueError(f"improbable_below must be in (0, 1), got {improbable_below!r}")
    contexts = [p.tokens for p, group in zip(prompts, samples) for _ in group]
    flat = [list(s) for group in samples for s in group]
    groups = [[tokenizer.decode(list(s)) for s in group] for group in samples if len(group) > 1]
    stats = token_stats(generator, contexts, flat, params, batch_size=batch_size)
    # Which prompt each sample (and each pooled token) belongs to.
    owner = np.repeat(np.arange(len(samples)), [len(group) for group in samples])  # [samples]
    lengths = np.array([len(s) for s in flat])
    token_owner = np.repeat(owner, lengths)  # [tokens]

    def by_prompt(values: np.ndarray, of=owner) -> list[float]:
        return np.bincount(of, weights=values, minlength=len(samples)).tolist()

    nll = {"generator": by_prompt(np.array([-lp.sum() for lp in metrics.continuation_logprobs(
        generator, contexts, flat, batch_size=batch_size)]))}
    if scorer is not None:
        nll["scorer"] = by_prompt(np.array([-lp.sum() for lp in metrics.continuation_logprobs(
            scorer, contexts, flat, batch_size=batch_size)]))
    tokens = by_prompt(lengths.astype(np.float64))
    if sum(tokens) == 0:
        raise ValueError("samples must hold at least one token to score, got none")
    per_prompt = {
        "samples": by_prompt(np.ones(len(flat))), "tokens": tokens,
        "eos": by_prompt(np.array([bool(s) and s[-1] == tokenizer.eos_id for s in flat], float)),
        **{f"nll_{name}": values for name, values in nll.items()},
        "top1": by_prompt(np.asarray(stats["top1"], np.float64), token_owner),
        "improbable": by_prompt((np.exp(stats["logprob"]) < improbable_below).astype(np.float64),
                                token_owner),
    }
    for n in range(1, 5):
        grams = [metrics.distinct_n([s], n) for s in flat]  # None: shorter than n
        per_prompt[f"distinct_{n}"] = by_prompt(np.array([g or 0.0 for g in grams]))
        per_prompt[f"ngram_samples_{n}"] = by_prompt(np.array([g is not None for g in grams],
                                                              float))
    bleu = [metrics.self_bleu(g) for g in groups]
    identical = [float(all(list(s) == list(g[0]) for s in g)) for g in samples if len(g) > 1]
    if groups and len(groups) == len(samples):
        per_prompt.update(self_bleu=bleu, identical=identical)
    if logprobs is not None:
        bits = np.array([-sum(lp) / math.log(2) for group in logprobs for lp in group])
        per_prompt["surprise"] = by_prompt(bits)

    def pooled_perplexity(name: str) -> float:
        loss = sum(nll[name]) / sum(tokens)
        return math.exp(loss) if loss < 709 else math.inf

    row = {
        "samples": len(flat),
        "mean_length": metrics.mean_length(flat),
        "eos_rate": metrics.eos_rate(flat, tokenizer.eos_id),
        "ppl_generator": pooled_perplexity("generator"),
        "ppl_scorer": pooled_perplexity("scorer") if scorer is not None else None,
        "surprise_generator": sum(nll["generator"]) / sum(tokens) / math.log(2),
        "surprise_sampled": (sum(per_prompt["surprise"]) / sum(tokens)
                             if logprobs is not None else None),
        "distinct_1": metrics.distinct_n(flat, 1),
        "distinct_2": metrics.distinct_n(flat, 2),
        "distinct_3": metrics.distinct_n(flat, 3),
        "repetition_4": metrics.repetition_rate(flat, 4),
        "self_bleu": float(np.mean(bleu)) if groups else None,
        "identical_samples": float(np.mean(identical)) if groups else None,
        "zipf": metrics.zipf_coefficient(flat),
        "top1_rate": float(np.mean(stats["top1"])),
        "improbable_rate": float(np.mean(np.exp(stats["logprob"]) < improbable_below)),
    }
    if "candidates" in stats:
        p10, p50, p90 = np.percentile(stats["candidates"], [10, 50, 90])
        row.update(candidates_p10=float(p10), candidates_median=float(p50),
                   candidates_p90=float(p90), candidates_mean=float(np.mean(stats["candidates"])))
    else:
        row.update(candidates_p10=None, candidates_median=None, candidates_p90=None,
                   candidates_mean=None)
    row["per_prompt"] = per_prompt
    return row
