"""What a logits processor reads: its per-row ``Parameter`` and the ``History`` of the tokens so
far."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.checks import describe_range

# --- Parameters -----------------------------------------------------------------------------------

_STORAGE = {"int32": np.iinfo(np.int32), "float32": np.finfo(np.float32)}

# Every range keeps the processed logits finite: a scale (the repetition penalty, 1 / temperature)
# of at most MAX_SCALE and shifts (a logit bias, a penalty per occurrence) of at most MAX_SHIFT
# keep model logits up to 1e30 in magnitude far inside float32, over any output length. Past them a
# setting overflows to +-inf (NaN, or every token removed) or does what a ban does better.
MAX_SCALE = 100
MAX_SHIFT = 100


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parameter:
    """A processor's per-row setting: what ``SamplingParams`` accepts and ``RowParams`` stores.

    Allowed: the values from ``low`` to ``high`` (``checks.check_number``'s range: None leaves a
    side open-ended, ``open_low`` / ``open_high`` exclude an end), plus ``also`` if given, as
    stored in ``dtype``."""

    name: str
    dtype: str  # "int32" or "float32": how RowParams stores it
    neutral: float  # the default; at this value the processor is the identity
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    also: float | None = None  # one more allowed value outside the range (temperature's 0)
    note: str  # what the special values mean, for error messages ("1 disables it")
    help: str  # what the setting does (SamplingParams' documentation)
    # Values >= the vocabulary size act as the neutral value and are stored as it (top-k).
    vocab_sized: bool = False

    @property
    def is_int(self) -> bool:
        return self.dtype == "int32"

    @property
    def rule(self) -> str:
        """What is allowed, in words: ``>= 0 (0 disables it)``, ``0 or >= 0.01 (...)``."""
        kind = "an int" if self.is_int else ""
        bounds = describe_range(self.low, self.high, open_low=self.open_low,
                                open_high=self.open_high)
        also = "" if self.also is None else f"{self.also:g} or"
        return f"{' '.join(w for w in (also, kind) if w)}{bounds} ({self.note})".strip()

    def admits(self, values: np.ndarray) -> np.ndarray:
        """Elementwise on a float64 array: inside the range (its ends rounded to the storage
        dtype, so an end itself is admitted), or ``also``."""
        def end(x):
            return float(np.asarray(x, self.dtype))

        ok = np.isfinite(values)
        if self.low is not None:
            ok &= values > end(self.low) if self.open_low else values >= end(self.low)
        if self.high is not None:
            ok &= values < end(self.high) if self.open_high else values <= end(self.high)
        return ok if self.also is None else ok | (values == self.also)

    def values(self, value: Any) -> np.ndarray:
        """``value`` as a 0-d or 1-d float64 array, or a ValueError naming the parameter: the
        right kind, inside the range of the dtype it is stored in (an int32 that would wrap, or a
        float that would overflow float32, is refused), and allowed (``admits``) as stored (a
        top_p of 1e-46 is 0 in float32)."""
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
        in_storage = ~np.isfinite(values) | ((values >= float(storage.min))
                                             & (values <= float(storage.max)))
        stored = np.where(in_storage & np.isfinite(values), values, 0).astype(self.dtype)
        checks = [(in_storage, f"must be in the range of {self.dtype}, the dtype it is stored in "
                               f"([{storage.min!s}, {storage.max!s}])"),
                  (self.admits(values) & self.admits(stored.astype(np.float64)),
                   f"must be {self.rule}")]
        for ok, must in checks:
            if not ok.all():
                i = int(np.argmin(ok.reshape(-1)))
                given, kept = array.reshape(-1)[i].item(), stored.reshape(-1)[i].item()
                where = name if array.ndim == 0 else f"{name}[{i}]"
                if in_storage.all() and self.admits(np.float64(given)):
                    must += f" as stored ({self.dtype} rounds it to {kept!r})"
                raise ValueError(f"{where} {must}, got {given!r}")
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
