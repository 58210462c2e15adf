"""Metrics of models and their outputs: perplexity of a token stream at a context length, and the
text quality of generated samples (continuation perplexity, distinct-n, repetition, self-BLEU,
Zipf coefficient, length and EOS rate; see the section at the end of this file).

What ``perplexity`` counts, exactly:

- ``stream`` is ``int [N]`` token ids (``data.token_stream``: documents as ``bos + ids + eos``,
  concatenated). Its ``N - 1`` tokens after the first are the *targets*.
- A *window* is ``L + 1`` consecutive tokens, ``L = context_len``: the model reads ``w[:-1]`` at
  positions ``0 .. L-1`` in one forward pass and predicts ``w[1:]``. The target at input position
  ``j`` is predicted from the ``j + 1`` tokens before it in its window (never from earlier windows).
- ``mode="chunks"``: windows start at ``0, L, 2L, ...`` (neighbours share one token) and every
  target of every window is scored: each target once, with 1 to L tokens of context. This is how
  ``train.evaluate`` over ``data.eval_windows`` counts.
- ``mode="sliding"``: windows start at ``0, S, 2S, ...`` (``S = stride``, ``1 <= S <= L``) and each
  window scores only its last ``S`` targets: each scored target sees ``L - S + 1`` to ``L`` tokens
  of context. The first ``L - S`` targets of the stream are not scored. ``S = L`` is ``"chunks"``.
- Both modes use the ``K = (N - L - 1) // S + 1`` windows that fit (``S = L`` for chunks); the
  remaining tail (fewer than ``S`` targets) is not scored. ``tokens = K * S`` targets are scored.
- ``loss`` is the mean negative log-likelihood in nats per scored target;
  ``perplexity = exp(loss)``.
- ``bits_per_char = loss * (N - 1) / num_chars / ln 2``: the mean loss per target, charged to all
  ``N - 1`` targets of the stream, over the ``num_chars`` characters the stream encodes. When every
  target is scored this is exactly the total nats / ln 2 / ``num_chars``; when a head or a tail is
  not scored, the scored targets stand in for them at their mean. Targets ``bos`` and ``eos`` count
  as tokens but encode no character (``data.split_num_chars`` counts the documents' characters).

One jit compilation serves every call with the same model structure, ``batch_size`` and
``context_len`` (the stride is a traced value); the last batch is padded and its padding rows
masked.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from decodelab.cache import bucket_length
from decodelab.checks import check_int, check_one_of, is_int
from decodelab.model.losses import token_nll, window_nll

MODES = ("chunks", "sliding")


@functools.partial(jax.jit, static_argnums=0)
def _scored_nll_sum(graphdef, state, windows, row_weights, first_scored):
    """``[B]``: per row, the NLL summed over targets at input positions ``>= first_scored``, times
    the row's weight (1 real, 0 padding); the caller adds the rows up in float64.

    ``graphdef`` is an nnx GraphDef with ``state`` its state, or a plain ``tokens -> logits``
    function with ``state`` None. windows: [B, L + 1] int32, row_weights: [B] float32.
    """
    model = graphdef if state is None else nnx.merge(graphdef, state)
    nll = window_nll(model, windows)  # [B, L]
    positions = jnp.arange(nll.shape[1], dtype=jnp.int32)  # [L]
    scored = (positions >= first_scored).astype(jnp.float32)[None, :] * row_weights[:, None]
    return (nll * scored).sum(axis=1)  # [B]


def perplexity(
    model: nnx.Module | Callable[[jax.Array], jax.Array],
    stream: np.ndarray,
    context_len: int,
    *,
    mode: str = "chunks",
    stride: int | None = None,
    batch_size: int = 16,
    num_chars: int | None = None,
    progress: bool = False,
) -> dict[str, float | int]:
    """Perplexity of ``model`` on ``stream`` at ``context_len`` (see the module docstring for what
    is scored). ``model`` maps ``tokens [B, T] int32 -> logits [B, T, V]``: a ``Transformer`` (or
    any nnx Module) or a plain function.

    Returns ``{"loss", "perplexity", "tokens", "window_nll"}`` plus ``"bits_per_char"`` when
    ``num_chars`` is given. ``window_nll``: per window, in stream order, the NLL (nats) summed over
    its ``stride`` scored targets (the evaluation units a bootstrap resamples).
    Raises ValueError naming a bad argument; a model with a learned position table refuses a
    ``context_len`` beyond it.
    """
    check_one_of("mode", mode, MODES)
    check_int("context_len", context_len, 1)
    if mode == "chunks":
        if stride is not None:
            raise ValueError(f"stride must be None for mode='chunks' (windows advance by "
                             f"context_len), got {stride!r}")
        stride = context_len
    elif not is_int(stride) or not 1 <= stride <= context_len:
        raise ValueError(f"stride must be an int in [1, context_len={context_len}] for "
                         f"mode='sliding', got {stride!r}")
    check_int("batch_size", batch_size, 1)
    if num_chars is not None:
        check_int("num_chars", num_chars, 1)
    stream = np.asarray(stream)
    if stream.ndim != 1 or not np.issubdtype(stream.dtype, np.integer):
        raise ValueError(f"stream must be a 1-D array of token ids, got shape {stream.shape} of "
                         f"{stream.dtype}")
    if len(stream) < context_len + 1:
        raise ValueError(f"stream must hold at least context_len + 1 = {context_len + 1} tokens, "
                         f"got {len(stream)}")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if stream.min() < 0 or (vocab_size is not None and stream.max() >= vocab_size):
        raise ValueError(f"stream must hold ids in [0, {vocab_size or 'V'}), got "
                         f"[{stream.min()}, {stream.max()}]")
    stream = stream.astype(np.int32)

    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
    else:
        graphdef, state = model, None
    num_windows = (len(stream) - context_len - 1) // stride + 1
    offsets = np.arange(context_len + 1)  # [L + 1]
    first_scored = np.int32(context_len - stride)
    partial_sums = []
    batches = range(0, num_windows, batch_size)
    for start in tqdm(batches, disable=not progress, desc=f"perplexity @{context_len}",
                      unit="batch", leave=False, dynamic_ncols=True):
        starts = np.arange(start, min(start + batch_size, num_windows)) * stride  # [b]
        windows = np.zeros((batch_size, context_len + 1), np.int32)  # [B, L + 1]
        windows[:len(starts)] = stream[starts[:, None] + offsets[None, :]]
        weights = np.zeros((batch_size,), np.float32)
        weights[:len(starts)] = 1.0
        partial_sums.append(_scored_nll_sum(graphdef, state, windows, weights, first_scored))
    tokens = num_windows * stride
    window_nll = np.concatenate([np.asarray(s, np.float64) for s in partial_sums])[:num_windows]
    loss = float(window_nll.sum() / tokens)
    # exp overflows a float past ~709 nats; such a model's perplexity is reported as inf.
    result = {"loss": loss, "perplexity": math.exp(loss) if loss < 709 else math.inf,
              "tokens": tokens, "window_nll": window_nll.tolist()}
    if num_chars is not None:
        result["bits_per_char"] = loss * (len(stream) - 1) / num_chars / math.log(2)
    return result


# --- Text quality of generated samples ------------------------------------------------------------
#
# A *sample* is one continuation: its token ids only, without the prompt (a finishing EOS
# included). Metrics of a set of samples weigh each sample equally: distinct-n and repetition are
# measured within each sample and averaged, so a set of human continuations (one per prompt) and
# a set of model samples (several per prompt) are read on the same scale. How alike the samples of
# one prompt are to each other is self-BLEU's job.


def _check_samples(name: str, samples) -> list[list[int]]:
    if isinstance(samples, (str, bytes)) or not isinstance(samples, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a list of token-id lists, got {type(samples).__name__}")
    if len(samples) == 0:
        raise ValueError(f"{name} is empty; give at least one sample")
    checked = []
    for i, sample in enumerate(samples):
        array = np.asarray(sample)
        if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"{name}[{i}] must be a 1-D list of int token ids, got {sample!r}")
        checked.append(array.astype(np.int64).tolist())
    return checked


def _ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(samples: Sequence[Sequence[int]], n: int) -> float | None:
    """Mean over samples of (distinct n-grams / n-grams) within the sample (Li et al. 2016, per
    sample); 1 when no n-gram repeats. Samples shorter than ``n`` have no n-grams and are left
    out; None if every sample is."""
    check_int("n", n, 1)
    ratios = [len(set(grams)) / len(grams)
              for grams in (_ngrams(s, n) for s in _check_samples("samples", samples)) if grams]
    return float(np.mean(ratios)) if ratios else None


def repetition_rate(samples: Sequence[Sequence[int]], n: int = 4) -> float | None:
    """Mean over samples of the share of the sample's n-grams that repeat an n-gram seen earlier in
    it: ``1 - distinct_n`` per sample (Welleck et al. 2019's seq-rep-n); 0 when nothing repeats.
    Samples shorter than ``n`` are left out; None if every sample is."""
    distinct = distinct_n(samples, n)
    return None if distinct is None else 1.0 - distinct


def self_bleu(texts: Sequence[str]) -> float:
    """Self-BLEU of the samples of one prompt (Zhu et al. 2018): the mean over samples of the
    sentence BLEU (sacrebleu, 0-100, its default 13a tokenization, effective n-gram order) of the
    sample against all the others as references. 100: every sample is a copy of another; near 0:
    they share almost no n-grams. A sample whose text is empty (or only whitespace) scores 0,
    even against copies of itself: judge determinism from the tokens, not from self-BLEU."""
    import sacrebleu  # deferred: only the text-quality metrics need it

    if isinstance(texts, str) or not isinstance(texts, Sequence) or len(texts) < 2:
        raise ValueError(f"texts must be a list of at least 2 strings, got {texts!r}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}] must be a str, got {type(text).__name__}")
    bleu = sacrebleu.metrics.BLEU(effective_order=True)
    scores = [bleu.sentence_score(text, [t for j, t in enumerate(texts) if j != i]).score
              for i, text in enumerate(texts)]
    return float(np.mean(scores))


def zipf_coefficient(samples: Sequence[Sequence[int]]) -> float | None:
    """The exponent s of a Zipf law ``count ~ rank^-s`` fitted to the token counts of all samples
    together: minus the least-squares slope of log(count) against log(rank) over every token that
    occurs (Holtzman et al. 2020 compare it with human text's). None with fewer than 2 distinct
    tokens."""
    counts = collections.Counter(t for s in _check_samples("samples", samples) for t in s)
    if len(counts) < 2:
        return None
    frequency = np.sort(np.fromiter(counts.values(), np.float64))[::-1]
    rank = np.arange(1, len(frequency) + 1, dtype=np.float64)
    slope = np.polyfit(np.log(rank), np.log(frequency), 1)[0]
    return float(-slope)


def mean_length(samples: Sequence[Sequence[int]]) -> float:
    """Mean tokens per sample."""
    return float(np.mean([len(s) for s in _check_samples("samples", samples)]))


def eos_rate(samples: Sequence[Sequence[int]], eos_ids: int | Sequence[int]) -> float:
    """Share of samples whose last token is one of ``eos_ids`` (they ended on their own rather than
    at the length budget)."""
    ids = {eos_ids} if isinstance(eos_ids, (int, np.integer)) else set(eos_ids)
    return float(np.mean([bool(s) and s[-1] in ids for s in _check_samples("samples", samples)]))


@functools.partial(jax.jit, static_argnums=0)
def _target_logprobs(graphdef, state, inputs, targets):
    """``[B, T]``: log-probability of ``targets[b, t]`` given ``inputs[b, :t + 1]``."""
    model = graphdef if state is None else nnx.merge(graphdef, state)
    return -token_nll(model(inputs), targets)


def continuation_logprobs(
    model: nnx.Module | Callable[[jax.Array], jax.Array],
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 32,
) -> list[np.ndarray]:
    """Per continuation, the ``model``'s log-probability (nats) of each of its tokens given its
    prompt and the continuation tokens before it: ``float64 [len(continuation)]`` each.

    One full forward pass per batch over ``prompt + continuation`` (no cache), padded at the end to
    a power-of-two length (at least 16), so one compilation serves every batch of that length.
    ``model`` maps ``tokens [B, T] -> logits [B, T, V]`` (a ``Transformer`` or a plain function).
    """
    prompts = _check_samples("prompts", prompts)
    continuations = _check_samples("continuations", continuations)
    check_int("batch_size", batch_size, 1)
    if len(prompts) != len(continuations):
        raise ValueError(f"prompts and continuations must pair up, got {len(prompts)} prompts and "
                         f"{len(continuations)} continuations")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompts[{i}] is empty; a prompt needs at least one token")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    ids = [t for seq in prompts + continuations for t in seq]
    if min(ids) < 0 or (vocab_size is not None and max(ids) >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size or 'V'}), got "
                         f"[{min(ids)}, {max(ids)}]")
    longest = max(len(p) + len(c) for p, c in zip(prompts, continuations)) - 1
    T = bucket_length(longest)
    limit = getattr(getattr(model, "positions", None), "max_positions", None)
    if limit is not None:
        if longest > limit:
            raise ValueError(f"prompt + continuation must fit the model's {limit} positions "
                             f"(max_seq_len) less one, got {longest + 1} tokens")
        T = min(T, limit)
    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
    else:
        graphdef, state = model, None
    result = []
    for start in range(0, len(prompts), batch_size):
        pairs = list(zip(prompts, continuations))[start:start + batch_size]
        inputs = np.zeros((batch_size, T), np.int32)  # [B, T]
        targets = np.zeros((batch_size, T), np.int32)
        for row, (p, c) in enumerate(pairs):
            sequence = p + c
            inputs[row, :len(sequence) - 1] = sequence[:-1]
            targets[row, :len(sequence) - 1] = sequence[1:]
        logp = np.asarray(_target_logprobs(graphdef, state, inputs, targets), np.float64)
        result += [logp[row, len(p) - 1:len(p) - 1 + len(c)] for row, (p, c) in enumerate(pairs)]
    return result


def continuation_perplexity(
    model: nnx.Module | Callable[[jax.Array], jax.Array],
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 32,
) -> float:
    """``exp`` of the mean negative log-likelihood per continuation token under ``model``, each
    token given its prompt and the continuation before it, all continuations' tokens pooled (see
    ``continuation_logprobs``). Raises ValueError if the continuations hold no token."""
    logprobs = continuation_logprobs(model, prompts, continuations, batch_size=batch_size)
    tokens = sum(len(lp) for lp in logprobs)
    if tokens == 0:
        raise ValueError("continuations must hold at least one token to score, got none")
    loss = -sum(float(lp.sum()) for lp in logprobs) / tokens
    return math.exp(loss) if loss < 709 else math.inf
