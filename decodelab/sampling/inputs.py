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
    # The default; for a processor's ``parameter``, the value at which it is the identity (a
    # processor's further ``settings`` take it as their default only).
    neutral: float
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


# The fields a decode loop carries so that the history processors read them instead of going over
# the ``[B, S]`` token buffer every step (``History.carried``, updated by ``History.extended``).
CARRIED = ("output_counts", "seen", "ngram_suffixes", "dry_suffixes")

# Longer than any row: the limit of a carried suffix that only a breaker ends.
UNBOUNDED = np.iinfo(np.int32).max


def suffix_rules(params: Any) -> dict[str, tuple[jax.Array, jax.Array | None]]:
    """The carried common suffixes (``History`` fields) and how each row follows them: its limit
    ``[B]`` (no suffix grows past it; 0 keeps them all 0, so a row that enables neither processor
    pays nothing) and the ``[B, V]`` tokens that end every suffix (a suffix never reaches back
    across one), or None. From ``params`` (a ``RowParams``): the no-repeat n-gram size - 1 (no
    row needs more, and a bound makes the carried and the recounted suffixes the same), and
    DRY's sequence breakers, unbounded otherwise (DRY caps the match only when it reads it)."""
    dry = (params.dry_multiplier != 0) & (params.dry_penalty_last_n != 0)
    return {"ngram_suffixes": (jnp.maximum(params.no_repeat_ngram_size - 1, 0), None),
            "dry_suffixes": (jnp.where(dry, UNBOUNDED, 0).astype(jnp.int32), params.dry_breakers)}


def _breaks(breakers: jax.Array | None, tokens: jax.Array) -> jax.Array | None:
    """``breakers[b, tokens[b, ...]]``: which of ``tokens [B, ...]`` end a suffix (None: none)."""
    if breakers is None:
        return None
    B = tokens.shape[0]
    return jnp.take_along_axis(breakers, tokens.reshape(B, -1), axis=1).reshape(tokens.shape)


def _common_suffixes(tokens: jax.Array, lengths: jax.Array, limits: jax.Array,
                     breakers: jax.Array | None = None) -> jax.Array:
    """``[B, S]`` int32: at slot j, the length of the longest common suffix of ``tokens[b, :j]``
    and ``tokens[b, :lengths[b]]``, at most ``limits[b]`` and never reaching back to the row's
    last breaker (``suffix_rules``); undefined at or past ``lengths``. One gather of the buffer
    per position of the longest such suffix: for the start of a loop, not for its steps."""
    B, S = tokens.shape
    slot = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[None, :], (B, S))
    if breakers is not None:  # the tokens since the last breaker bound every suffix
        last = jnp.max(jnp.where(_breaks(breakers, tokens) & (slot < lengths[:, None]), slot, -1),
                       axis=1)
        limits = jnp.minimum(limits, lengths - 1 - last)

    def grow(carry):  # the k-th token before slot j against the k-th last
        k, alive, total = carry
        before = jnp.take_along_axis(tokens, jnp.maximum(slot - k, 0), axis=1)
        last = jnp.take_along_axis(tokens, jnp.maximum(lengths - k, 0)[:, None], axis=1)
        alive = alive & (slot >= k) & (k <= limits[:, None]) & (before == last)
        return k + 1, alive, total + alive.astype(jnp.int32)

    # No common suffix of a slot below S is longer than S - 1 (and a loop to 2**31 - 1 never ends);
    # the loop stops at the longest suffix below the lengths, not at the limit (``O(B S)`` a pass;
    # slot ``lengths`` would match all the way, being the row's own suffix).
    end = jnp.minimum(jnp.max(limits, initial=0), S - 1) + 1
    start = (jnp.int32(1), slot < lengths[:, None], jnp.zeros((B, S), jnp.int32))
    return jax.lax.while_loop(lambda c: (c[0] < end) & jnp.any(c[1]), grow, start)[2]


def _extend_suffixes(suffixes: jax.Array, tokens: jax.Array, token: jax.Array,
                     limits: jax.Array, breakers: jax.Array | None = None) -> jax.Array:
    """``_common_suffixes`` after ``token [B]`` is appended to each row (``tokens [B, S]`` holds
    it already at the old length): slot j's suffix is slot j - 1's plus one where the token
    before j is the new one, else empty; all empty after a breaker. One shifted compare, no
    gather of the buffer."""
    broken = _breaks(breakers, token)
    if broken is not None:
        limits = jnp.where(broken, 0, limits)
    before = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)), constant_values=-1)  # [B, S]: token j - 1
    grown = jnp.minimum(jnp.pad(suffixes[:, :-1], ((0, 0), (1, 0))) + 1, limits[:, None])
    return jnp.where(before == token[:, None], grown, 0)


@struct.dataclass(kw_only=True)
class History:
    """The tokens of each row so far: prompt, then output. What penalties and bans look at.

    A decode loop carries ``CARRIED`` (``carried`` at the start, ``extended`` by each kept
    token); without them (None) they are recounted from ``tokens`` when read. Speculative
    verification reads the history at several positions of each row at once: rows ``b * T + t``
    of ``tokens``, ``prompt_lengths`` and ``lengths`` are row b at its t-th position, and with
    ``ahead`` (``[B, T]``) the carried fields are row b's before ``ahead[b, :t]``, which the
    readers append (in their own branch: a round with no history processor on pays nothing).
    The carried common suffixes (no-repeat n-grams', DRY's) are one mechanism: ``suffix_rules``
    says how far each row follows each array and which tokens end its suffixes.
    """

    tokens: jax.Array  # [B, S] int32; slot j holds position j; slots at or past `lengths` ignored
    prompt_lengths: jax.Array  # [B] int32
    lengths: jax.Array  # [B] int32, prompt + output tokens
    eos_mask: jax.Array  # [V] bool, the ids min_new_tokens suppresses
    output_counts: jax.Array | None = None  # [B, V] int32, occurrences in the output
    seen: jax.Array | None = None  # [B, V] bool, occurs in prompt or output
    # [B, S] int32 each: ``_common_suffixes`` of the row under its ``suffix_rules``
    ngram_suffixes: jax.Array | None = None
    dry_suffixes: jax.Array | None = None
    ahead: jax.Array | None = None  # [B, T] int32, see above
    # [B] float32, each row's Mirostat target surprise in bits (``mirostat``), row b's before
    # ``ahead[b]``; None: every row's start value. Not counted from the tokens: the loops carry
    # it and move it by each kept token's log-probability (``mirostat.advanced_mu``).
    mirostat_mu: jax.Array | None = None

    @property
    def num_generated(self) -> jax.Array:  # [B]
        return self.lengths - self.prompt_lengths

    @property
    def carried_fields(self) -> dict[str, jax.Array | None]:
        return {name: getattr(self, name) for name in CARRIED}

    def carried(self, params: Any) -> History:
        """This history with ``CARRIED`` counted from ``tokens`` (``params``: the rows'
        ``RowParams``, for ``suffix_rules``): what a decode loop starts from."""
        V = self.eos_mask.shape[0]
        return self.replace(
            output_counts=self.counts(V, output_only=True),
            seen=self.counts(V, output_only=False) > 0,
            **{name: _common_suffixes(self.tokens, self.lengths, limits, breakers)
               for name, (limits, breakers) in suffix_rules(params).items()})

    def extended(self, block: jax.Array, count: jax.Array, params: Any) -> History:
        """This history (with ``CARRIED``) after the first ``count[b]`` tokens of ``block [B,
        T]`` are appended to each row; ``tokens`` must hold them already, from ``lengths[b]``.
        One scatter per count over the ``B * T`` tokens, ``T`` shifted compares per carried
        suffix array that some row follows (one that none follows is skipped at run time)."""
        B, T = block.shape
        kept = jnp.arange(T, dtype=jnp.int32)[None, :] < count[:, None]  # [B, T]
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
        counted = jnp.where(kept, block, self.eos_mask.shape[0])  # out of range: dropped

        def extend(limits, breakers):
            def grow(t, suffixes):
                longer = _extend_suffixes(suffixes, self.tokens, block[:, t], limits, breakers)
                return jnp.where(kept[:, t, None], longer, suffixes)

            return lambda suffixes: jax.lax.fori_loop(0, T, grow, suffixes)

        return self.replace(
            lengths=self.lengths + count,
            output_counts=self.output_counts.at[rows, counted].add(1, mode="drop"),
            seen=self.seen.at[rows, counted].set(True, mode="drop"),
            **{name: jax.lax.cond(jnp.any(limits > 0), extend(limits, breakers), lambda x: x,
                                  getattr(self, name))
               for name, (limits, breakers) in suffix_rules(params).items()})

    def along(self, block: jax.Array) -> History:
        """The history at the positions ``lengths[b] + t``, ``t < T``, of each row, with
        ``block [B, T]`` (held by ``tokens`` from ``lengths``) appended before them: ``B * T``
        rows, ``b * T + t`` with the first t tokens of ``block[b]`` (layout in the class
        docstring)."""
        B, T = block.shape
        repeat = lambda a: jnp.repeat(a, T, axis=0)  # noqa: E731  [B, ...] -> [B*T, ...]
        lengths = self.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # [B, T]
        return self.replace(tokens=repeat(self.tokens), prompt_lengths=repeat(self.prompt_lengths),
                            lengths=lengths.reshape(B * T), ahead=block)

    def _ahead_counts(self) -> jax.Array:
        """``[B, T, V]`` int32: occurrences of each token in ``ahead[b, :t]``."""
        B, T = self.ahead.shape
        V = self.eos_mask.shape[0]
        after = jnp.broadcast_to(jnp.arange(1, T + 1)[None, :], (B, T))  # each counts from t + 1
        once = jnp.zeros((B, T, V), jnp.int32).at[jnp.arange(B)[:, None], after, self.ahead].add(
            1, mode="drop")
        return jnp.cumsum(once, axis=1)

    def output_occurrences(self, vocab_size: int) -> jax.Array:
        """``[B, V]`` int32: occurrences of each token in the output."""
        if self.output_counts is None:
            return self.counts(vocab_size, output_only=True)
        if self.ahead is None:
            return self.output_counts
        counts = self.output_counts[:, None] + self._ahead_counts()  # [B, T, V]
        return counts.reshape(-1, vocab_size)

    def seen_tokens(self, vocab_size: int) -> jax.Array:
        """``[B, V]`` bool: the tokens that occur in the prompt or the output."""
        if self.seen is None:
            return self.counts(vocab_size, output_only=False) > 0
        if self.ahead is None:
            return self.seen
        return (self.seen[:, None] | (self._ahead_counts() > 0)).reshape(-1, vocab_size)

    def suffixes(self, params: Any, name: str = "ngram_suffixes") -> jax.Array:
        """``[B, S]`` int32: at slot j, the length of the longest common suffix of the row's
        tokens before j and its whole sequence, as the carried field ``name`` follows it under
        ``params`` (``suffix_rules``: for no-repeat n-grams at most the size - 1, for DRY back
        to the last sequence breaker); undefined at or past ``lengths``."""
        limits, breakers = suffix_rules(params)[name]
        carried = getattr(self, name)
        if carried is None:
            return _common_suffixes(self.tokens, self.lengths, limits, breakers)
        if self.ahead is None:
            return carried
        B, T = self.ahead.shape
        tokens = self.tokens[::T]  # [B, S]: each row's, the block in place
        limits = limits[::T]
        breakers = None if breakers is None else breakers[::T]

        def grow(suffixes, token):  # the suffixes before a position, then after its token
            return _extend_suffixes(suffixes, tokens, token, limits, breakers), suffixes

        _, before = jax.lax.scan(grow, carried, self.ahead.T)  # [T, B, S]
        return jnp.swapaxes(before, 0, 1).reshape(B * T, -1)

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
