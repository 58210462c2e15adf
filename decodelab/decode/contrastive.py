"""contrastive_search(): at each step, the one of the ``k`` most probable tokens that is both
likely and unlike the context (Su et al. 2022, "A Contrastive Framework for Neural Text
Generation"; Su and Collier 2023).

Conventions (every caller relies on them):

- Row b's next token is ``argmax_v (1 - alpha_b) * p(v | x<t) - alpha_b * max_{j<t} cos(h_v, h_j)``
  over the ``k`` tokens ``v`` of largest logit, where ``p`` is the model's distribution (the
  softmax of its logits, no sampling processors; a padded vocabulary's ids past the tokenizer's
  size are never candidates), ``h_v`` is the hidden state of candidate ``v`` at position t and
  ``h_j`` that of every earlier position of the row, prompt included. A hidden state is the last
  block's output through the model's final norm (``model.final_norm`` of the ``taps=(L,)``
  stream: the input of ``lm_head``), as Hugging Face's implementation read
  ``hidden_states[-1]`` of models whose last hidden state is normed. ``alpha = 0`` is greedy
  decoding: the candidates come in descending logit order (ties to the lower id) and the first
  largest score wins, so it picks exactly ``greedy``'s argmax. A candidate the model gives
  probability 0 (logit -inf) or whose score is NaN is never chosen.
- The ``k`` candidates of every row are scored in one model call over ``B * k`` rows, not in
  ``k`` calls. The cache has ``B * k`` rows (row ``b * k + i`` is candidate i of row b), each a
  plain copy of its row's history made once after the prefill, so attention reads each row's
  slots directly, with no per-slot gather. A step writes each candidate's token into its own
  row; keeping the chosen one then copies that one new slot (every layer) into its prompt's
  other candidate rows (``keep_newest_slot``), since they already hold the same prefix. So
  nothing of the prefix is ever copied again, and the memory is ``k`` times ``generate``'s
  cache. (A ``BeamCache`` slot table would save that memory but make every attention read a
  gather.) The chosen candidate's logits and hidden state come from the same call: they are
  the next step's logits and the context's newest entry, so a step is one forward of ``k``
  tokens per row and nothing else.
- The context's hidden states are carried in the state as unit vectors ``[B, S, D]`` (float32),
  written once per kept token: the prefill writes the prompt's, each step the chosen
  candidate's. A step reads every slot and masks those at or past the row's length.
- Stops, outputs and validation are ``generate``'s: ``DecodeOptions`` (``eos_ids``, stop
  sequences and strings, ``max_len``, ``tokenizer``, top log-probabilities and entropy of the
  model's distribution, ``python_loop``, ``raise_on_error``) checked by ``request``, the output
  a ``GenerateOutput`` whose ``logprobs`` are the chosen tokens' log-probabilities under the
  model. A row stops at an EOS id, a stop sequence or string, its budget or ``max_len``, or
  logits that hold NaN / +inf ("error").
- Compiles: ``alpha`` is array data (one value per prompt), so any alphas share one program;
  ``k`` is static (the candidate forward's row count), one program per ``k``. Prompt lengths,
  batch sizes and budgets are bucketed as in ``generate``. ``CONTRASTIVE_LOOP`` runs the steps
  as one compiled ``lax.while_loop`` (no host round trip per token) or, with ``python_loop``, as
  its Python twin (same step, same tokens).
- ``kv_cache``: None (float) or "int8" (the kept slot is dequantized and quantized again, to the
  same values); KIVI's int4 cache is refused (a row cannot take another row's slot: its key
  groups and float ring follow one row's own history).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache import Cache, bytes_per_token, check_kind, init_cache
from decodelab.checks import (check_memory, check_model, check_number, is_int,
                              nbytes, position_limit)
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.output import GenerateOutput, finish_output, host_output
from decodelab.decode.request import (BAD_LOGITS, EOS, LENGTH, NO_ALLOWED_TOKEN, RUNNING, STOP,
                                      DecodeOptions, OutputSpec, RowInputs, check_request,
                                      decode_buffers)
from decodelab.decode.shapes import batch_shapes, prompt_block, prompt_width
from decodelab.decode.state import RowState
from decodelab.model.parts import split
from decodelab.sampling import select
from decodelab.sampling.params import SamplingParams
from decodelab.sharding import data_size


@struct.dataclass(kw_only=True)
class ContrastiveState(RowState):
    """What the contrastive loop carries: ``RowState``'s fields, then its own. ``B`` rows, ``k``
    candidates each, ``S`` cache slots, ``D`` model width."""

    cache: Cache  # B * k rows, row b's candidates at rows b * k .. b * k + k - 1
    logits: jax.Array  # [B, V] float32, the model's logits for each row's next token
    context: jax.Array  # [B, S, D] float32, unit hidden state of each position (< lengths)
    alpha: jax.Array  # [B] float32, the degeneration penalty's weight
    usable: jax.Array  # [V] bool, ids a row may take (False: a padded vocabulary's padding)

    @property
    def top_k(self) -> int:
        return self.cache.batch_size // self.tokens.shape[0]


def unit_hidden(model: nnx.Module, stream: jax.Array) -> jax.Array:
    """``[..., D]`` last-block stream -> ``[..., D]`` float32 unit vectors of its normed form
    (the input of ``lm_head``); a zero vector stays zero (cosine 0 with everything)."""
    h = model.final_norm(stream).astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(jnp.square(h), axis=-1, keepdims=True))
    return h / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny)


def keep_newest_slot(cache: Cache, rows: jax.Array, layers: int) -> Cache:
    """``cache`` with each row's newest slot (at its length - 1) overwritten, in every layer, by
    that slot of row ``rows[i]`` (``rows: [R]``, a row of the same length): the chosen candidate
    kept in every candidate row of its prompt at the cost of one slot per row, since the rows
    already share everything before it. Reads and writes go through the ``Cache`` protocol
    (``gather``, ``write``: an int8 slot is dequantized and quantized again, to the same
    values), one layer after another on the same buffers, so they stay in place."""
    at = cache.lengths - 1  # [R]
    cache = cache.rewind(at)
    for layer in range(layers):
        k, v = cache.gather(layer, rows[:, None], at[:, None])  # [R, K, 1, H] each
        cache = cache.write(layer, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
    return cache.advance(jnp.ones_like(at))


def contrastive_scores(candidates: jax.Array, logp: jax.Array, hidden: jax.Array,
                       context: jax.Array, lengths: jax.Array, alpha: jax.Array) -> jax.Array:
    """``[B, k]`` scores of the candidates ``[B, k]`` (ids, their logits -inf where the model
    rules them out): ``(1 - alpha) * p - alpha * max cos`` from the rows' log-probabilities
    ``logp [B, V]``, the candidates' unit hidden states ``[B, k, D]`` and the context's ``[B, S,
    D]`` (slots below ``lengths [B]`` count); -inf for a ruled-out candidate or a NaN score."""
    S = context.shape[1]
    chosen = jnp.take_along_axis(logp, candidates, axis=1)  # [B, k]
    cosine = jnp.einsum("BKD,BSD->BKS", hidden, context)
    seen = jnp.arange(S, dtype=jnp.int32)[None, None, :] < lengths[:, None, None]  # [B, 1, S]
    degeneration = jnp.max(jnp.where(seen, cosine, -jnp.inf), axis=-1)  # [B, k]
    a = alpha[:, None]
    scores = (1.0 - a) * jnp.exp(chosen) - a * degeneration
    return jnp.where((chosen > -jnp.inf) & ~jnp.isnan(scores), scores, -jnp.inf)


def _step(model: nnx.Module, state: ContrastiveState) -> ContrastiveState:
    """Score every running row's ``k`` candidates in one call, keep the best, record it, and keep
    its new cache slot, logits and hidden state."""
    B, S = state.tokens.shape
    K, N, V = state.top_k, state.max_new_tokens, state.logits.shape[-1]
    logits = jnp.where(state.usable[None, :], state.logits, -jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)  # [B, V]
    # Descending logits, ties to the lower id: with alpha 0 the first is greedy's argmax. No
    # sort of the vocabulary: k argmax passes (here XLA on CPU compiled lax.top_k to a sort).
    top, candidates = select.largest(logits, K)  # [B, k]
    bad = sampling.bad_logits(state.logits)
    none = ~(top[:, 0] > -jnp.inf)
    write = ~state.done & ~bad & ~none  # [B]

    L = model.config.n_layers
    feed = jnp.repeat(write, K).astype(jnp.int32)  # [B * k]: other rows' caches stand still
    cand_logits, cache, stream = model(candidates.reshape(B * K, 1), cache=state.cache,
                                       num_valid=feed, taps=(L,))
    hidden = unit_hidden(model, stream[0, :, 0]).reshape(B, K, -1)  # [B, k, D]
    scores = contrastive_scores(candidates, logp, hidden, state.context, state.lengths,
                                state.alpha)
    choice = jnp.argmax(scores, axis=-1).astype(jnp.int32)  # [B]
    rows = jnp.arange(B, dtype=jnp.int32)
    token = candidates[rows, choice]

    slot = jnp.where(write, state.lengths, S)  # out of range: dropped
    tokens = state.tokens.at[rows, slot].set(token, mode="drop")
    record = state.recorded((rows, jnp.where(write, state.num_generated, N)),
                            logp[rows, token], lambda: logp)
    context = state.context.at[rows, slot].set(hidden[rows, choice], mode="drop")
    lengths = state.lengths + write.astype(jnp.int32)
    at_end = (lengths - state.prompt_lengths >= state.budgets) | (lengths >= S)
    code = jnp.select([bad, none, state.eos_mask[token],
                       state.ends_with_stop(tokens, lengths[:, None])[:, 0], at_end],
                      [BAD_LOGITS, NO_ALLOWED_TOKEN, EOS, STOP, LENGTH], RUNNING)
    kept = jnp.repeat(rows * K + choice, K)  # every candidate row takes the chosen one's slot
    return state.replace(
        step=state.step + 1, tokens=tokens, lengths=lengths, context=context,
        finish=jnp.where(state.done, state.finish, code),
        cache=keep_newest_slot(cache, kept, L),
        logits=cand_logits[:, 0].reshape(B, K, V)[rows, choice], **record)


def _body(weights, state: ContrastiveState, *, graphdef) -> ContrastiveState:
    return _step(nnx.merge(graphdef, weights), state)


CONTRASTIVE_LOOP = CompiledLoop("_contrastive", _body, lambda weights, state: state.running(),
                                static_argnames=("graphdef",))


@struct.dataclass(kw_only=True)
class ContrastiveInputs:
    """What each row of a contrastive search starts with, beside its tokens."""

    rows: RowInputs  # generate's per-row values (lengths, budgets, EOS mask, stop sequences)
    alpha: jax.Array  # [B] float32, in [0, 1]
    usable: jax.Array  # [V] bool, ids below the tokenizer's size (all without a tokenizer)


@functools.partial(jax.jit, static_argnames=("graphdef", "top_k", "max_len", "outputs",
                                             "kv_cache"))
def contrastive_prefill(weights, block, inputs: ContrastiveInputs, *, graphdef, top_k, max_len,
                        outputs: OutputSpec, kv_cache=None) -> ContrastiveState:
    """Prefill the padded prompt block ``[B, T]`` once, keep its hidden states as the context and
    give each row ``top_k`` candidate rows, copies of its cache row: the state
    ``CONTRASTIVE_LOOP`` runs from."""
    model = nnx.merge(graphdef, weights)
    B, T = block.shape
    rows = inputs.rows
    lengths = rows.prompt_lengths
    cache = init_cache(model.config, B, max_len, kv_cache)
    logits, cache, stream = model(block, cache=cache, num_valid=lengths, reach=T,
                                  taps=(model.config.n_layers,))
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    hidden = unit_hidden(model, stream[0])  # [B, T, D]
    context = jnp.zeros((B, max_len, hidden.shape[-1]), jnp.float32).at[:, :T].set(hidden)
    candidates = jnp.repeat(jnp.arange(B, dtype=jnp.int32), top_k)  # [B * k]
    return ContrastiveState.start(block, rows, max_len, outputs,
                                  cache=cache.take_rows(candidates), logits=last,
                                  context=context, alpha=inputs.alpha,
                                  usable=inputs.usable)


# --- Entry point ----------------------------------------------------------------------------------


def _check_alpha(penalty_alpha: Any, B: int) -> np.ndarray:
    """``[B]`` float32 weights in [0, 1] from one number or one per prompt."""
    if isinstance(penalty_alpha, (Sequence, np.ndarray)) and not isinstance(penalty_alpha, str):
        if len(penalty_alpha) != B:
            raise ValueError(f"penalty_alpha has {len(penalty_alpha)} values but there are {B} "
                             f"prompts; give one number in [0, 1] or one per prompt")
        values = [check_number(f"penalty_alpha[{i}]", a, 0, 1)
                  for i, a in enumerate(penalty_alpha)]
    else:
        values = [check_number("penalty_alpha", penalty_alpha, 0, 1)] * B
    return np.asarray(values, np.float32)


def contrastive_search(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    penalty_alpha: float | Sequence[float],
    top_k: int,
    max_new_tokens: int,
    *,
    kv_cache: str | None = None,
    options: DecodeOptions = DecodeOptions(),
) -> GenerateOutput:
    """Continue each prompt by contrastive search (module docstring), up to ``max_new_tokens``.

    Args:
      model: a ``Transformer`` (any module with its call signature, ``taps`` and
        ``final_norm``).
      prompts: one list of token ids per prompt, of any lengths.
      penalty_alpha: the degeneration penalty's weight in [0, 1], one number or one per prompt;
        0 is greedy decoding.
      top_k: candidates per step, in ``[1, vocab_size]`` (at most the tokenizer's size with
        ``options.tokenizer``); a new value compiles a new program, a new alpha does not.
      max_new_tokens: the output budget per row, clamped as in ``generate``.
      kv_cache: None (a float cache) or "int8" (module docstring; "int4" is refused).
      options: a ``DecodeOptions``, as ``generate`` reads it.

    Returns a ``GenerateOutput``: tokens, lengths, finish reasons, and each token's
    log-probability under the model.
    """
    check_model("model", model)
    check_kind("kv_cache", kv_cache, shared_by="contrastive search")
    V = model.config.vocab_size
    request = check_request(V, prompts, SamplingParams.greedy(), max_new_tokens, 0, options)
    rows = request.rows
    alpha = _check_alpha(penalty_alpha, len(rows))
    if not is_int(top_k) or not 1 <= top_k <= V:
        raise ValueError(f"top_k must be an int in [1, vocab_size={V}], got {top_k!r}")
    K = int(top_k)
    U = request.tokenizer_size or V
    if K > U:
        raise ValueError(f"top_k must be <= the tokenizer's size {U}, got {top_k}")
    if not callable(getattr(model, "final_norm", None)):
        raise ValueError(f"model must have a final_norm (contrastive search reads its normed "
                         f"hidden states), got {type(model).__name__}")
    shapes = batch_shapes(rows, request.max_new_tokens, options.max_len, position_limit(model),
                          data_size(model))
    S, B = shapes.max_len, shapes.padded_rows
    buffers = decode_buffers(model.config, B, S, shapes.width, prompt_width(rows, S),
                             request.top_n, request.with_entropy)
    buffers.update({"KV cache": B * K * S * bytes_per_token(model.config, kv_cache),
                    "context hidden states": nbytes((B, S, model.config.d_model), np.float32)})
    check_memory("contrastive_search", buffers, {"len(prompts)": len(rows), "top_k": K,
                                                 "max_new_tokens": shapes.columns, "max_len": S})
    block, lengths = prompt_block(rows, shapes)
    graphdef, weights = split(model)
    inputs = ContrastiveInputs(rows=request.row_inputs(lengths, V, shapes),
                               alpha=np.pad(alpha, (0, B - len(rows)), mode="edge"),
                               usable=np.arange(V) < U)
    state = contrastive_prefill(weights, block, inputs, graphdef=graphdef, top_k=K, max_len=S,
                                outputs=request.outputs(shapes), kv_cache=kv_cache)
    state = CONTRASTIVE_LOOP.run(weights, state, python_loop=request.python_loop,
                                 graphdef=graphdef)
    return finish_output(host_output(state, shapes), state.finish, request)
