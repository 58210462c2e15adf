"""What continuous batching and paged KV memory should buy at a published benchmark's shapes, by
the decode roofline (the memory side of ``roofline``: a decode step reads every weight once and
each running request's keys and values, and moves bytes at the memory bandwidth).

The gain of paged continuous batching over static batching on padded slots splits into two
factors (``roofline_prediction``):

- scheduling: continuous over static on the same slots, at most the slot-steps full static
  batches hold over those their requests need (``static_waste``, simulated for exponential
  outputs);
- memory: the tokens/s of the batch a paged pool fits over that of the padded slots, each step
  taking ``(W + B x held x kv_bytes) / bandwidth`` for ``B`` tokens.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# The pool's occupancy in a saturated steady state (vLLM's paper: under 4% of KV memory wasted).
FULL_POOL = 0.96


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A published serving benchmark's shapes: the model (``params`` at ``bytes_per_value``,
    ``n_layers`` of width ``d_model``), the GPU (``gpu_memory_gb`` less ``workspace_gb``, at
    ``bandwidth_gbs``), the requests (``prompt`` tokens, exponential outputs of mean
    ``mean_output`` cut at ``output_cap``) and the gain it reports (``gain``)."""

    gain: float
    n_layers: int
    d_model: int
    params: float
    bytes_per_value: int
    gpu_memory_gb: float
    bandwidth_gbs: float
    workspace_gb: float
    prompt: int
    output_cap: int
    mean_output: float

    @property
    def reservation(self) -> int:
        """Tokens a padded slot reserves: the prompt and the longest output."""
        return self.prompt + self.output_cap

    def reservation_ratio(self, mean_output: float) -> float:
        """The reservation over a request's mean length at ``mean_output``."""
        return self.reservation / (self.prompt + mean_output)


def static_waste(mean_output: float, cap: int, batch: int, seed: int = 0,
                 batches: int = 20000) -> float:
    """Decode steps a full static batch of ``batch`` requests spends (every row held until the
    batch's longest output ends) over the steps its requests need, for outputs drawn from an
    exponential distribution of mean ``mean_output`` cut at ``cap`` (``batches`` batches, seeded):
    continuous batching's ideal gain from scheduling alone at saturation."""
    rng = np.random.default_rng(seed)
    outputs = np.minimum(np.ceil(rng.exponential(mean_output, size=(batches, batch))), cap)
    outputs = np.maximum(outputs, 1)
    return float(outputs.max(axis=1).sum() * batch / outputs.sum())


def roofline_prediction(benchmark: Benchmark, mean_output: float,
                        occupancy: float) -> dict[str, float]:
    """The decomposition at ``benchmark``'s shapes: a step reads the weights once and each
    running request's keys and values, so it takes ``(W + B * held * kv_bytes) / bandwidth`` and
    gives ``B`` tokens, ``held = prompt + mean_output / 2`` the tokens a request holds on average
    while it decodes. Padded slots: the KV memory over the reservation (``prompt +
    output_cap``); paged: the KV memory at ``occupancy`` (the share of the pool holding live
    tokens) over ``held``. Scheduling: ``static_waste`` for the padded batch. Returns the KV
    tokens, the batch sizes, the factors and their product, and the reservation ratio."""
    b = benchmark
    weights = b.params * b.bytes_per_value
    kv_per_token = 2 * b.n_layers * b.d_model * b.bytes_per_value
    kv_tokens = ((b.gpu_memory_gb - b.workspace_gb) * 1e9 - weights) / kv_per_token
    padded = max(math.floor(kv_tokens / b.reservation), 1)
    held = b.prompt + mean_output / 2
    paged = kv_tokens * occupancy / held

    def throughput(batch: float) -> float:
        return batch / ((weights + batch * held * kv_per_token) / (b.bandwidth_gbs * 1e9))

    memory = throughput(paged) / throughput(padded)
    scheduling = static_waste(mean_output, b.output_cap, padded)
    return {"kv_tokens": kv_tokens, "padded_batch": padded, "paged_batch": paged,
            "memory": memory, "scheduling": scheduling, "product": memory * scheduling,
            "ratio": b.reservation_ratio(mean_output)}
