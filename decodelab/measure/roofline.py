"""The roofline of a decode step: how fast this machine could possibly run it, measured here.

A decode step feeds one token per row through the model. It cannot take less than the larger of

- the time to read its bytes once from memory: every parameter, plus the keys and values of the
  tokens each row attends to (``bytes / bandwidth``), and
- the time to do its arithmetic at the machine's dense matmul rate (``FLOPs / matmul FLOP/s``),

with both rates *measured on this machine in this process* (``measure_bandwidth``,
``measure_matmul_flops``), not taken from a data sheet. What is counted (``step_cost``):

- parameter bytes: every parameter once per step. With tied embeddings the logits projection reads
  the whole table, so this is exact; an untied embedding or a learned position table is read only at
  B rows, so there it is an upper bound.
- KV-cache bytes: ``2 (k and v) x L x B x S x K x H x itemsize`` for ``S`` attended positions per
  row: the minimum, what an implementation that reads only valid slots would read. (decodelab's
  static cache attends over all ``max_len`` slots and masks; that difference is part of what the
  achieved/roofline ratio measures.) Writing the new token's k/v and the activations are ignored.
- FLOPs: ``2 x B x`` (matmul parameters: per layer q, k, v, o and the MLP, plus the ``V x D``
  logits projection) plus attention ``4 x B x L x N x H x S`` (scores and weighted values).
  Norms, RoPE, softmax and sampling are ignored.

Each of these leaves out work, so the roofline is a true lower bound on the step time and the ratio
``roofline / measured`` is at most about 1.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

from decodelab.checks import check_int, check_number
from decodelab.config import ModelConfig


def median_time(fn, *args, repeats: int = 5) -> float:
    """Median wall seconds of ``fn(*args)`` (blocked until ready) over ``repeats`` runs, after one
    untimed warm-up run (which compiles a jitted ``fn``)."""
    check_int("repeats", repeats, 1)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@jax.jit
def _read_all(x: jax.Array) -> jax.Array:
    return jnp.sum(x)


@jax.jit
def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def measure_bandwidth(num_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Memory read bandwidth in bytes/s: a jitted sum over a float32 array of ``num_bytes`` (it
    must be much larger than the CPU caches for a DRAM figure; 512 MiB by default), bytes read over
    the median time. A sum reads each byte once and writes nothing, so no write-allocate traffic
    or first-touch page faults of a fresh output buffer dilute the figure."""
    check_int("num_bytes", num_bytes, 4)
    x = jnp.ones((num_bytes // 4,), jnp.float32)  # [num_bytes / 4]
    seconds = median_time(_read_all, x, repeats=repeats)
    return x.nbytes / seconds


def measure_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
    """Dense float32 matmul rate in FLOP/s: a jitted ``[n, n] @ [n, n]`` (``2 n^3`` FLOPs) over
    its median time."""
    check_int("n", n, 1)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)  # [n, n]
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)  # [n, n]
    seconds = median_time(_matmul, a, b, repeats=repeats)
    return 2.0 * n**3 / seconds


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one decode step must move and compute (see the module docstring)."""

    param_bytes: int
    kv_bytes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.param_bytes + self.kv_bytes

    def seconds(self, bandwidth: float, flops_per_s: float) -> float:
        """The roofline time: ``max(bytes / bandwidth, flops / flops_per_s)``."""
        for name, rate in (("bandwidth", bandwidth), ("flops_per_s", flops_per_s)):
            check_number(name, rate, 0, open_low=True)
        return max(self.bytes / bandwidth, self.flops / flops_per_s)


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that multiply each token's activations: per layer q, k, v, o and the MLP, plus
    the ``V x D`` logits projection (the embedding lookup and the norms are not matmuls)."""
    D, F, L, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    mlp = (3 if cfg.mlp == "swiglu" else 2) * D * F
    return L * (D * N * H + 2 * D * K * H + N * H * D + mlp) + V * D


def step_cost(cfg: ModelConfig, batch_size: int, attended: int) -> StepCost:
    """The cost of one decode step of ``batch_size`` rows, each attending to ``attended`` positions
    (the tokens in its cache plus the one fed now)."""
    B = check_int("batch_size", batch_size, 1)
    S = check_int("attended", attended, 1)
    L, N, K, H = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    itemsize = jnp.dtype(cfg.dtype).itemsize
    # Parameters are stored in float32 whatever the compute dtype (ModelConfig.dtype).
    param_bytes = cfg.num_params() * 4
    kv_bytes = 2 * L * B * S * K * H * itemsize
    flops = 2 * B * matmul_params(cfg) + 4 * B * L * N * H * S
    return StepCost(param_bytes=param_bytes, kv_bytes=kv_bytes, flops=flops)


def decode_seconds(cfg: ModelConfig, batch_size: int, prompt_len: int, steps: int,
                   bandwidth: float, flops_per_s: float) -> float:
    """Roofline time of ``steps`` decode steps after a ``prompt_len``-token prompt: step ``i``
    (0-based) attends to ``prompt_len + i + 1`` positions. Divide by ``steps`` for the time of an
    average step."""
    P = check_int("prompt_len", prompt_len, 1)
    steps = check_int("steps", steps, 1)
    return sum(step_cost(cfg, batch_size, P + i + 1).seconds(bandwidth, flops_per_s)
               for i in range(steps))
