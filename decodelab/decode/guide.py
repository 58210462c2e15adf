"""Classifier-free guidance and DoLa as options of ``generate`` (``DecodeOptions.guidance_scale``,
``negative_prompts`` and ``dola_layers``): checked on the host before anything is traced, DoLa's
candidate layers resolved for the model, and the inputs of the doubled batch built. How a step
scores with them is ``scoring``'s.

Conventions (``generate`` and its callers rely on them):

- ``guidance_scale``: None (off, the default), or a finite number, or one per prompt; data, so
  any scales run the same program (CFG on and off are two). CFG needs ``negative_prompts``: one
  token-id list per prompt (with n samples, each sample takes its prompt's). An empty one means
  the prompt's last token alone, what transformers' CFG uses when it is given none.
- A row's unconditional stream is its negative prompt then the tokens the row keeps. With
  ``guidance_scale`` 0 a row's tokens are those plain decoding of its negative prompt gives,
  except where the sampling reads more than the model's scores: the random stream (drawn at the
  row's position, so the same only for a negative prompt as long as the prompt), the history
  the penalties read (the prompt's and the output's tokens, as transformers' processors read the
  conditional sequence) and the budget.
- Both streams need cache room: the default ``max_len`` covers the longer of each prompt and its
  negative prompt, and a row ends ("length") when either stream fills ``max_len``.
- ``dola_layers``: None (off), "low", "high", or a list of distinct layer indices in ``[0, L)``
  for an L-layer model (0: the embeddings; layer L, the final one, is what they are contrasted
  with). "low" and "high" map as transformers' ``_dola_decoding`` did: low is ``[s, L/2)`` and
  high ``[L/2, L)`` in steps of 2 (past 40 layers ``[s, 20)`` and ``[L - 20, L)``), where the
  start s skips the embeddings of a model with tied embeddings (s = 2, or 1 for 2 layers: their
  early exit is close to the identity). transformers drops list entries >= L; here they are an
  error. The layers are static: one program per choice. The model must be a ``Transformer``
  (its ``taps`` and ``head``). transformers recommends ``repetition_penalty`` 1.2 with DoLa;
  nothing sets it for you.
- Not this round: CFG and DoLa together (refused), and either in ``speculative_generate``
  (refused); ``beam_search`` and the serving engine take neither option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from decodelab.checks import check_number, is_int, kv_cache_bytes, nbytes, token_ids
from decodelab.decode.scoring import Scoring
from decodelab.decode.shapes import Shapes, prompt_width

DOLA_NAMED = ("low", "high")


@dataclasses.dataclass(frozen=True)
class Guide:
    """A call's checked CFG and DoLa options (``check_guide``); the default is neither."""

    scale: np.ndarray | None = None  # [P] float32, each prompt's guidance scale; None: no CFG
    negatives: tuple[np.ndarray, ...] = ()  # one int32 negative prompt per prompt (CFG)
    dola_layers: str | tuple[int, ...] | None = None  # as given; resolved by ``layers``

    def refuse(self, entry: str) -> None:
        """ValueError naming the option when either is set: ``entry`` does not take them."""
        for name, value in (("guidance_scale", self.scale), ("dola_layers", self.dola_layers)):
            if value is not None:
                raise ValueError(f"{entry} does not take {name} (classifier-free guidance and "
                                 f"DoLa run in generate), got {name}={value!r}")

    def layers(self, model: Any) -> tuple[int, ...]:
        """DoLa's candidate layers for ``model`` (module docstring); () without DoLa."""
        if self.dola_layers is None:
            return ()
        if not callable(getattr(model, "head", None)):
            raise ValueError(f"dola_layers needs a model with early exits (a Transformer: taps "
                             f"and head), got a {type(model).__name__}")
        return dola_candidates(self.dola_layers, model.config.n_layers,
                               model.config.tie_embeddings)

    def shape_rows(self, rows: list[np.ndarray], max_len: Any,
                   limit: int | None) -> list[np.ndarray]:
        """What sizes the cache: each prompt, or with CFG the longer of it and its negative prompt,
        which must fit ``max_len`` (when given) and the position table ``limit``."""
        if self.scale is None:
            return rows
        for i, negative in enumerate(self.negatives):
            for bound, name in ((max_len, "max_len"), (limit, "the position table")):
                if is_int(bound) and len(negative) >= bound:
                    raise ValueError(f"negative_prompts[{i}] has {len(negative)} tokens but "
                                     f"{name} is {bound}; the unconditional stream needs room "
                                     f"for output too")
        return [max(r, negative, key=len) for r, negative in zip(rows, self.negatives)]

    def buffers(self, cfg: Any, rows: int, max_len: int, width: int,
                layers: tuple[int, ...]) -> dict[str, int]:
        """Bytes of the buffers CFG and DoLa add to ``rows`` state rows (prompt block ``width``
        wide) for ``checks.check_memory``."""
        found = {}
        if self.scale is not None:
            found["unconditional KV cache"] = kv_cache_bytes(cfg, rows, max_len)
            found["unconditional prefill logits"] = nbytes((rows, width, cfg.vocab_size),
                                                           np.float32)
        if layers:
            found["DoLa early exits"] = (nbytes((len(layers), rows, width, cfg.d_model),
                                                np.float32)
                                         + nbytes((rows, len(layers), cfg.vocab_size), np.float32))
        return found

    def prefill_inputs(self, block: np.ndarray, inputs: Any, shapes: Shapes, samples: int,
                       layers: tuple[int, ...]) -> tuple[np.ndarray, Any, Scoring]:
        """``(block, inputs, scoring)`` for ``generation.prefill``: the prompt block ``[P', T]``
        widened to hold the negative prompts' too, the state rows' ``RowInputs`` with each
        budget within the room its negative prompt leaves, and the ``Scoring``, with CFG holding
        the negative block ``[P', T]`` and its lengths ``[P']``. State row r is sample
        ``r % samples`` of prompt ``r // samples`` (``samples``)."""
        if self.scale is None:
            return block, inputs, Scoring(dola_layers=layers)
        S, P = shapes.max_len, len(self.negatives)
        width = max(block.shape[1], prompt_width(list(self.negatives), S))
        negative_block = np.zeros((block.shape[0], width), np.int32)
        negative_lengths = np.ones((block.shape[0],), np.int32)  # a padding row: one token
        for i, negative in enumerate(self.negatives):
            negative_block[i, :len(negative)], negative_lengths[i] = negative, len(negative)
        prompt = np.minimum(np.arange(shapes.padded_rows) // samples, P - 1)  # [R]
        budgets = np.minimum(inputs.budgets, S - negative_lengths[prompt]).astype(np.int32)
        block = np.pad(block, ((0, 0), (0, width - block.shape[1])))
        return block, inputs.replace(budgets=budgets), Scoring(
            guidance=jnp.asarray(self.scale[prompt]), dola_layers=layers,
            negatives=(negative_block, negative_lengths))


def dola_candidates(dola_layers: str | tuple[int, ...], n_layers: int,
                    tied: bool) -> tuple[int, ...]:
    """DoLa's candidate premature layers of an ``n_layers`` model (module docstring)."""
    L = n_layers
    if isinstance(dola_layers, str):
        start = 0 if not tied else 2 if L > 2 else 1 if L == 2 else 0
        if dola_layers == "low":
            layers = [start] if start == L // 2 else range(start, L // 2 if L <= 40 else 20, 2)
        else:
            layers = range(L // 2 if L <= 40 else L - 20, L, 2)
        if not layers:
            raise ValueError(f"dola_layers={dola_layers!r} leaves no candidate layer for this "
                             f"{L}-layer model; give a list of layer indices in [0, {L})")
        return tuple(layers)
    if any(i >= L for i in dola_layers):
        raise ValueError(f"dola_layers must be layer indices in [0, {L}) for this {L}-layer "
                         f"model (0: the embeddings; {L}, the final layer, is what they are "
                         f"contrasted with), got {list(dola_layers)}")
    return dola_layers


def _check_dola_layers(dola_layers: Any) -> str | tuple[int, ...] | None:
    if dola_layers is None or (isinstance(dola_layers, str) and dola_layers in DOLA_NAMED):
        return dola_layers
    if (isinstance(dola_layers, (str, bytes)) or not isinstance(dola_layers, Sequence)
            or not dola_layers or not all(is_int(i) and i >= 0 for i in dola_layers)
            or len(set(dola_layers)) != len(dola_layers)):
        raise ValueError(f"dola_layers must be None, 'low', 'high' or a non-empty list of "
                         f"distinct layer indices >= 0, got {dola_layers!r}")
    return tuple(int(i) for i in dola_layers)


def _check_scale(guidance_scale: Any, P: int) -> np.ndarray:
    if isinstance(guidance_scale, (Sequence, np.ndarray)) and not isinstance(guidance_scale, str):
        if len(guidance_scale) != P:
            raise ValueError(f"guidance_scale must be one number or one per prompt ({P}), got "
                             f"{len(guidance_scale)} values")
        values = [check_number(f"guidance_scale[{i}]", g) for i, g in enumerate(guidance_scale)]
    else:
        values = [check_number("guidance_scale", guidance_scale)] * P
    return np.asarray(values, np.float32)


def check_guide(guidance_scale: Any, negative_prompts: Any, dola_layers: Any,
                rows: list[np.ndarray], vocab_size: int) -> Guide:
    """The checked options for the checked prompts ``rows``; ValueError names the bad field."""
    dola = _check_dola_layers(dola_layers)
    if guidance_scale is None:
        if negative_prompts is not None:
            raise ValueError(f"negative_prompts is for classifier-free guidance, which needs a "
                             f"guidance_scale; got guidance_scale=None and negative_prompts="
                             f"{negative_prompts!r}")
        return Guide(dola_layers=dola)
    if dola is not None:
        raise ValueError(f"dola_layers cannot be combined with guidance_scale (classifier-free "
                         f"guidance) yet; got dola_layers={dola_layers!r} and guidance_scale="
                         f"{guidance_scale!r}")
    P = len(rows)
    scale = _check_scale(guidance_scale, P)
    if (isinstance(negative_prompts, (str, bytes))
            or not isinstance(negative_prompts, (Sequence, np.ndarray))
            or len(negative_prompts) != P):
        raise ValueError(f"negative_prompts must hold one token-id list per prompt ({P}; [] for "
                         f"the prompt's last token) when guidance_scale is set, got "
                         f"{negative_prompts!r}")
    negatives = []
    for i, ids in enumerate(negative_prompts):
        empty = isinstance(ids, (Sequence, np.ndarray)) and not isinstance(ids, str) and not len(ids)
        negatives.append(rows[i][-1:] if empty else
                         token_ids(f"negative_prompts[{i}]", ids, vocab_size))
    return Guide(scale=scale, negatives=tuple(negatives))
