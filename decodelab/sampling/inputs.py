"""What a logits processor reads: its per-row ``Parameter`` and the ``History`` of the tokens so
far."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# --- Parameters -----------------------------------------------------------------------------------

_STORAGE = {"int32": np.iinfo(np.int32), "float32": np.finfo(np.float32)}


@dataclasses.dataclass(frozen=True)
class Parameter:
    """A processor's per-row setting: what ``SamplingParams`` accepts and ``RowParams`` stores."""

    name: str
    dtype: str  # "int32" or "float32": how RowParams stores it
    neutral: float  # the default; at this value the processor is the identity
    allowed: Callable[[np.ndarray], np.ndarray]  # elementwise on a float64 array
    rule: str  # what `allowed` admits, in words (for error messages)
    help: str  # what the setting does (SamplingParams' documentation)
    # Values >= the vocabulary size act as the neutral value and are stored as it (top-k).
    vocab_sized: bool = False

    @property
    def is_int(self) -> bool:
        return self.dtype == "int32"

    def values(self, value: Any) -> np.ndarray:
        """``value`` as a 0-d or 1-d float64 array, or a ValueError naming the parameter: the
        right kind, allowed by ``rule``, and inside the range of the dtype it is stored in (an
        int32 that would wrap, or a float that would overflow float32, is refused)."""
        name, kind = self.name, ("an int" if self.is_int else "a number")
        if isinstance(value, jax.core.Tracer):
            raise ValueError(f"{name} must be a concrete value, got a traced array")
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be {kind} or one per row, got {value!r}") from None
        if array.ndim > 1 or (array.ndim == 1 and array.size == 0):
            raise ValueError(f"{name} must be a scalar or a 1-D sequence with one value per row, "
                             f"got shape {array.shape}")
        numeric = np.issubdtype(array.dtype, np.integer if self.is_int else np.number)
        if array.dtype == bool or not numeric or np.iscomplexobj(array):
            raise ValueError(f"{name} must be {kind} or one per row, got {value!r}")
        values = array.astype(np.float64)
        storage = _STORAGE[self.dtype]
        checks = [(np.isfinite(values) & self.allowed(values), f"must be {self.rule}"),
                  ((values >= float(storage.min)) & (values <= float(storage.max)),
                   f"must be in the range of {self.dtype}, the dtype it is stored in "
                   f"([{storage.min!s}, {storage.max!s}])")]
        for ok, must in checks:
            if not ok.all():
                if array.ndim == 0:
                    raise ValueError(f"{name} {must}, got {value!r}")
                i = int(np.argmin(ok))
                raise ValueError(f"{name}[{i}] {must}, got {array[i].item()!r}")
        return values


# --- What a processor may look at -----------------------------------------------------------------


@struct.dataclass(kw_only=True)
class History:
    """The tokens of each row so far: prompt, then output. What penalties and bans look at."""

    tokens: jax.Array  # [B, S] int32; slot j holds position j; slots at or past `lengths` ignored
    prompt_lengths: jax.Array  # [B] int32
    lengths: jax.Array  # [B] int32, prompt + output tokens
    eos_mask: jax.Array  # [V] bool, the ids min_new_tokens suppresses
    # What the decode loop carries instead of counting `tokens` every step (None: count them,
    # as speculative decoding does, whose rounds rewind).
    output_counts: jax.Array | None = None  # [B, V] int32, occurrences in the output
    seen: jax.Array | None = None  # [B, V] bool, occurs in prompt or output

    @property
    def num_generated(self) -> jax.Array:  # [B]
        return self.lengths - self.prompt_lengths

    def output_occurrences(self, vocab_size: int) -> jax.Array:
        """``[B, V]`` int32: occurrences of each token in the output."""
        if self.output_counts is not None:
            return self.output_counts
        return self.counts(vocab_size, output_only=True)

    def seen_tokens(self, vocab_size: int) -> jax.Array:
        """``[B, V]`` bool: the tokens that occur in the prompt or the output."""
        if self.seen is not None:
            return self.seen
        return self.counts(vocab_size, output_only=False) > 0

    def counts(self, vocab_size: int, *, output_only: bool) -> jax.Array:
        """``[B, V]`` int32: occurrences of each token in the output (or in prompt + output),
        counted from ``tokens``."""
        B, S = self.tokens.shape
        slot = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
        start = self.prompt_lengths[:, None] if output_only else jnp.zeros((B, 1), jnp.int32)
        valid = (slot >= start) & (slot < self.lengths[:, None])  # [B, S]
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
        return jnp.zeros((B, vocab_size), jnp.int32).at[rows, self.tokens].add(
            valid.astype(jnp.int32), mode="drop")
