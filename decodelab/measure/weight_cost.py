"""What storing the weights in 16 bits costs beside float32: one ``generate`` per storage on the
same rows.

``STORAGES`` are the 16-bit storages the decode-speed page times (``dl.quantize(model,
weights=...)``: projections and the embedding table stored in that dtype, computed in float32).
``time_storages`` times the float32 model and each storage greedily, their repetitions interleaved
(``timing.time_interleaved``), and keeps each one's repetitions under its own prefix
(``<storage>_generate_reps_s``, ``<storage>_prefill_reps_s``; float32's unprefixed), from which
the page's step ratios and their intervals are formed (``report.speed.step_ratio``), with the
parameter bytes each storage holds.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from decodelab.compress.quantization import quantize
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.measure import timing
from decodelab.model import Transformer
from decodelab.sampling.params import SamplingParams

STORAGES = ("bfloat16", "float16")


def param_bytes(model: Transformer) -> int:
    """The bytes of the model's parameters as stored."""
    return sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


def time_storages(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  max_len: int) -> dict:
    """Greedy timings of the float32 ``model`` (unprefixed, ``timing.time_generate``'s keys) and
    of its copy stored in each of ``STORAGES`` (under ``<storage>_``), the same rows
    (``prompts [B, P]``) and ``max_len`` cache slots, with ``param_bytes`` (prefixed alike).
    Every call generates ``new_tokens`` per row."""
    models = {"": model, **{name: quantize(model, weights=name) for name in STORAGES}}
    options = DecodeOptions(max_len=max_len or prompts.shape[1] + new_tokens)
    greedy = SamplingParams(temperature=0.0)
    runs = {name: functools.partial(generate, m, prompts.tolist(), greedy, seed=0,
                                    options=options) for name, m in models.items()}
    found = timing.time_interleaved(runs, prompts.shape[0], new_tokens, repeats)
    found.update({f"{name}_param_bytes" if name else "param_bytes": param_bytes(m)
                  for name, m in models.items()})
    return found
