"""n samples per prompt from one prefill (``generate(..., n=...)``, ``speculative_generate``).

Conventions (both entry points rely on them):

- The P prompts are prefilled once, in a block of ``cache.bucket_rows(P)`` rows; the state that
  decodes has ``P * n`` rows, row ``p * n + i`` being sample i of prompt p, padded to
  ``cache.bucket_rows(P * n)`` rows (``shapes.sample_shapes``, as any batch). Each state row
  starts from a copy of its prompt's cache rows and logits (``sample_block``'s index, taken by
  the prefill).
- Sample i of a prompt draws from ``sampling.sample_keys``: sample 0 from the prompt's own key,
  so it is exactly the ``n=1`` output for the same seed; each sample's stream depends only on
  its prompt's key and its index (with per-request seeds, never on batch-mates).
- Outputs come back grouped ``[P, n, ...]`` (``grouped``); with ``n=1`` nothing changes shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from decodelab.cache import bucket_rows
from decodelab.checks import check_size
from decodelab.decode.output import GenerateOutput
from decodelab.decode.request import BatchRequest
from decodelab.decode.shapes import Shapes, prompt_block


def with_samples(request: BatchRequest, n: object) -> BatchRequest:
    """``request`` with ``n`` samples per prompt (an int >= 1, else ValueError naming ``n``)."""
    return dataclasses.replace(request, samples=check_size("n", n, 1))


def sample_block(request: BatchRequest, shapes: Shapes, data: int = 1) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(block, block_lengths, lengths, index)``: the P prompts in a ``[P', T]`` block for the
    one prefill and their lengths ``[P']``, each state row's prompt length ``[R]`` (``R``:
    ``shapes.padded_rows``, of ``shapes.sample_shapes``), and the block row each state row
    continues (``[R]`` int32; a padding row the last prompt's), or None with one sample (then
    the block's rows are the state's)."""
    n, P = request.samples, len(request.rows)
    if n == 1:
        block, lengths = prompt_block(request.rows, shapes)
        return block, lengths, lengths, None
    block, lengths = prompt_block(request.rows, dataclasses.replace(
        shapes, rows=P, padded_rows=bucket_rows(P, data)))
    index = np.minimum(np.arange(shapes.padded_rows) // n, P - 1).astype(np.int32)
    return block, lengths, lengths[index], index


def grouped(out: GenerateOutput, n: int) -> GenerateOutput:
    """``out`` of ``P * n`` rows (row ``p * n + i``: sample i of prompt p) as ``[P, n, ...]``
    arrays and one list of n finish reasons per prompt; unchanged when ``n == 1``. Fields a
    subclass adds (speculative decoding's ``stats``) stay per row."""
    if n == 1:
        return out
    P = len(out.lengths) // n

    def group(a):
        return None if a is None else a.reshape((P, n) + a.shape[1:])

    names = ("tokens", "lengths", "logprobs", "top_logprobs", "top_ids", "entropy")
    reasons = out.finish_reason
    return dataclasses.replace(out, **{name: group(getattr(out, name)) for name in names},
                               finish_reason=[reasons[p * n:(p + 1) * n] for p in range(P)])
