"""Exact cuts and draws without sorting the vocabulary: a fixed, bounded number of ``O(V)`` passes.

A truncation that keeps "the largest tokens until a count or a mass is reached" (top-k, top-p,
typical-p) needs one number per row, its cut: the smallest key that is kept. ``largest_cut``
finds it by a bracketed search over the integer image of the float32 keys (``sortable``: integer
order is float order, ties map to one integer), each pass one masked sum over ``[B, V]``:

- the bracket ``[lo, top]`` always holds the cut: the weight at or above ``lo`` reaches the
  target (or ``lo`` is the row's smallest key), the weight above ``top`` does not;
- a pass tries a pivot in ``(lo, top]`` and moves one end to it; of every three passes the first
  pivot is the secant guess from the two ends' weights and the second the midpoint, both in float
  value (where counts and masses are smooth), and the third bisects the integer range, so at most
  ``MAX_PASSES = 3 x 32`` passes are needed and a smooth row needs a handful;
- a row stops when its bracket holds one token or one tied group, so the cut is a key of the
  row, found exactly, ties included; the loop ends when every row has stopped.

``largest`` is ``lax.top_k`` for a few candidates (contrastive search's k): k argmax passes, no
sort of the row.

``draw`` samples from ``[..., V]`` log-probabilities with one uniform per row: the inverse of the
distribution function in token-id order, summed in two levels (blocks, then within one block), so
a draw reads the row twice and never generates ``V`` random numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_INT_MAX = jnp.iinfo(jnp.int32).max
_INT_MIN = jnp.iinfo(jnp.int32).min
_NEG_INF_KEY = -2139095041  # sortable(-inf): the bits of -inf, 0xFF800000, xor INT_MAX
MAX_PASSES = 96  # 32 bisections of a 32-bit range, each after two passes in value space


def sortable(x: jax.Array) -> jax.Array:
    """float32 -> int32 with the same order (``-inf`` lowest, ``+inf`` highest) and ``-0.0`` and
    ``0.0`` one integer; NaN maps somewhere (callers never pass it a row they keep)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    # Integer operations only: XLA on CPU flushes subnormals to zero in float compares, so
    # ``x == 0.0`` would tie every subnormal with 0. -0.0 is the bit pattern of INT_MIN.
    bits = jnp.where(bits == jnp.int32(_INT_MIN), 0, bits)
    return jnp.where(bits < 0, bits ^ jnp.int32(_INT_MAX), bits)


def unsortable(key: jax.Array) -> jax.Array:
    """The inverse of ``sortable``: int32 -> float32."""
    bits = jnp.where(key < 0, key ^ jnp.int32(_INT_MAX), key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _midpoint(lo: jax.Array, top: jax.Array) -> jax.Array:
    """``floor((lo + top) / 2) + 1`` without overflow: in ``(lo, top]`` when ``top > lo``."""
    return (lo & top) + ((lo ^ top) >> 1) + 1


def largest_cut(keys: jax.Array, weights: jax.Array | None, target: jax.Array,
                active: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The largest key ``c`` of each row whose weight at or above it reaches the target:
    ``c = max{keys[b, j] : sum(weights[b] where keys[b] >= keys[b, j]) >= target[b]}``, or the
    row's smallest key when no key qualifies (the weights sum to less than the target).

    Args:
      keys: ``[B, V]`` int32 (``sortable`` of the values that order the tokens, largest first).
      weights: ``[B, V]`` float32 >= 0 (probabilities, to sum mass), or None to count tokens.
      target: ``[B]`` float32 > 0.
      active: ``[B]`` bool; an inactive row is not searched (its cut is its smallest key).

    Returns ``([B] int32 cut, [] int32 passes)``.

    The bracket ``[lo, top]`` (integer keys) holds the cut: the weight at or above ``lo`` reaches
    the target, the weight above ``top`` does not. A row stops when one token's key lies in it
    (the counts at both ends differ by one) or it is one integer wide. Two passes in three try
    a pivot in value space (the secant of the weights at the ends, then the midpoint), the third
    bisects the integer range, so 3 x 32 passes bound any row (ties need the integer bisection:
    a tied group never splits) and a smooth row stops after a handful.
    """
    counting = weights is None
    target = target.astype(jnp.float32)
    ones = jnp.ones(keys.shape, jnp.float32)
    weights = ones if counting else weights
    top = jnp.max(keys, axis=-1)
    # The bracket starts at the smallest key that can be the cut: the smallest finite key when
    # the finite ones reach a count, the smallest key of positive weight for a mass (removed
    # tokens, -inf with weight 0, would otherwise leave no finite end for the value passes).
    real = (keys > _NEG_INF_KEY) if counting else (weights > 0)
    lowest_real = jnp.min(jnp.where(real, keys, _INT_MAX), axis=-1)
    enough = jnp.any(real, axis=-1) & (jnp.sum(jnp.where(real, weights, 0.0), axis=-1) >= target)
    lo = jnp.where(enough, lowest_real, jnp.min(keys, axis=-1))
    n_lo = jnp.sum(jnp.where(keys >= lo[:, None], 1.0, 0.0), axis=-1)  # tokens at or above lo
    n_hi = jnp.zeros_like(n_lo)  # tokens above top
    w_lo, w_hi = (n_lo if counting else jnp.sum(weights, axis=-1)), jnp.zeros_like(n_lo)

    def open_rows(lo, top, n_lo, n_hi):
        return active & (top > lo) & (n_lo - n_hi > 1)

    def running(carry):
        lo, top, n_lo, n_hi, _, _, passes = carry
        return jnp.any(open_rows(lo, top, n_lo, n_hi)) & (passes < MAX_PASSES)

    def one_pass(carry):
        lo, top, n_lo, n_hi, w_lo, w_hi, passes = carry
        open_ = open_rows(lo, top, n_lo, n_hi)
        v_lo, v_top = unsortable(lo), unsortable(top)
        finite = jnp.isfinite(v_lo) & jnp.isfinite(v_top)
        share = jnp.where(passes % 3 == 0,
                          jnp.clip((w_lo - target) / jnp.maximum(w_lo - w_hi, 1e-30), 0.05, 0.95),
                          0.5)
        in_value = sortable(v_lo + (v_top - v_lo) * share)
        pivot = jnp.where(finite & (passes % 3 != 2), in_value, _midpoint(lo, top))
        pivot = jnp.clip(pivot, lo + 1, jnp.maximum(top, lo + 1))
        at_or_above = keys >= pivot[:, None]
        n = jnp.sum(jnp.where(at_or_above, 1.0, 0.0), axis=-1)
        w = n if counting else jnp.sum(jnp.where(at_or_above, weights, 0.0), axis=-1)
        up = open_ & (w >= target)  # the cut is at or above the pivot
        down = open_ & ~up  # the cut is below the pivot
        return (jnp.where(up, pivot, lo), jnp.where(down, pivot - 1, top),
                jnp.where(up, n, n_lo), jnp.where(down, n, n_hi),
                jnp.where(up, w, w_lo), jnp.where(down, w, w_hi), passes + 1)

    lo, *_, passes = jax.lax.while_loop(
        running, one_pass, (lo, top, n_lo, n_hi, w_lo, w_hi, jnp.zeros((), jnp.int32)))
    # The cut is the bracket's one token (or its tied group): the smallest key at or above lo.
    cut = jnp.min(jnp.where(keys >= lo[:, None], keys, _INT_MAX), axis=-1)
    return cut, passes


def keep_exactly(keys: jax.Array, k: jax.Array, active: jax.Array) -> jax.Array:
    """``[B, V]`` bool: the ``k[b]`` largest keys of each active row, the lowest ids among those
    tied with the k-th largest (all True in an inactive row). ``k`` in ``[1, V]``.

    One search finds the k-th largest key; the tokens tied with it that still fit are the first
    ones in id order, by a running count of the tie (run only when some row's tie overflows)."""
    cut, _ = largest_cut(keys, None, k.astype(jnp.float32), active)
    above = keys > cut[:, None]
    tied = keys == cut[:, None]
    room = k - jnp.sum(above, axis=-1)  # [B], how many tied tokens still fit, >= 1
    crowded = active & (jnp.sum(tied, axis=-1) > room)

    def lowest_tied():  # the first `room` tied ids (a row whose tie fits keeps all of it)
        return tied & (jnp.cumsum(tied, axis=-1, dtype=jnp.int32) <= room[:, None])

    fits = jax.lax.cond(jnp.any(crowded), lowest_tied, lambda: tied)
    return above | fits | ~active[:, None]


def largest(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``lax.top_k(x, k)`` without a sort: ``(values, ids)`` ``[..., k]`` of the ``k`` largest
    entries of each row of ``x [..., V]``, in descending order, ties to the lower id (``-0.0``
    and ``0.0`` tie, as in ``argmax``; ``lax.top_k`` puts ``0.0`` first), by ``k``
    passes of an argmax over ``sortable`` keys (each pass then rules its winner out). For the
    few candidates of a search step (``k`` static and small: the passes grow with k, a sort
    does not). In contrastive search's loop XLA on CPU compiled ``lax.top_k`` to a sort of each
    row's whole vocabulary (elsewhere, beam search's loop among them, to its TopK call). Rows
    must hold no NaN (their order is then unspecified, as ``sortable``'s is)."""
    V = x.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k must be in [1, {V}] (the rows' length), got {k!r}")
    keys = sortable(x)
    ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    found = []
    for _ in range(k):
        best = jnp.argmax(keys, axis=-1).astype(jnp.int32)  # the first (lowest id) of a tie
        found.append(best)
        keys = jnp.where(ids == best[..., None], _INT_MIN, keys)  # below every float's key
    chosen = jnp.stack(found, axis=-1)
    return jnp.take_along_axis(x, chosen, axis=-1), chosen


def keep_top_weight(keys: jax.Array, weights: jax.Array, target: jax.Array,
                    active: jax.Array) -> jax.Array:
    """``[B, V]`` bool: the smallest set of largest keys whose weight reaches the fraction
    ``target[b]`` (in ``(0, 1]``) of the row's total weight, and every token tied with the last
    one kept (all True in an inactive row). The fraction is of the float32 total, so a target
    just below 1 is always reached, however the row's float32 probabilities round."""
    total = jnp.sum(weights, axis=-1)  # [B]
    cut, _ = largest_cut(keys, weights, target.astype(jnp.float32) * total, active)
    return (keys >= cut[:, None]) | ~active[:, None]


# --- The draw ---------------------------------------------------------------------------------


def _block_size(V: int) -> int:
    block = 16
    while block * block < V:
        block *= 2
    return block


def _first_passing(through: jax.Array, mass: jax.Array, point: jax.Array) -> jax.Array:
    """``[R, n]`` inclusive sums and the ``[R, n]`` masses they sum, ``[R]`` points -> ``[R]``:
    the first entry with mass whose sum passes the point, else the last entry with mass (0 if
    none has mass). An entry without mass is never chosen, however the sums round."""
    slots = jnp.arange(through.shape[-1], dtype=jnp.int32)[None, :]
    end = jnp.int32(through.shape[-1])
    first = jnp.min(jnp.where((through > point[:, None]) & (mass > 0), slots, end), axis=-1)
    last = jnp.max(jnp.where(mass > 0, slots, 0), axis=-1)
    return jnp.where(first < end, first, last)


def draw(logprobs: jax.Array, keys: jax.Array) -> jax.Array:
    """``[..., V]`` log-probabilities (normalised or not; ``-inf`` = never) and ``[...]`` typed
    keys -> ``[...]`` int32 draws, exactly from them: the first token whose cumulative
    probability, in id order, passes ``u`` times the total, ``u`` one uniform from the row's key.
    A token whose float32 probability is 0 is never drawn, however the sums round; a row with
    no allowed token gives 0 (the decode loops never keep it)."""
    return draw_with_total(logprobs, keys)[0]


def draw_with_total(logits: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``draw``'s tokens and ``[...]`` the log of each row's total, ``logsumexp(logits)`` (-inf
    where no token is allowed), from the sums the draw forms anyway: the drawn token's
    log-probability is ``logits[token] - total``, with no log-softmax over ``[..., V]``."""
    shape, V = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, V)
    R = flat.shape[0]
    G = _block_size(V)
    n_blocks = -(-V // G)
    best = jnp.max(flat, axis=-1)  # [R]
    shift = jnp.where(best > -jnp.inf, best, 0.0)
    p = jnp.exp(flat - shift[:, None])  # [R, V], in [0, 1]
    p = jnp.pad(p, ((0, 0), (0, n_blocks * G - V))).reshape(R, n_blocks, G)
    block_mass = jnp.sum(p, axis=-1)  # [R, n]
    through = jnp.cumsum(block_mass, axis=-1)  # [R, n], inclusive
    u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys.reshape(R))
    point = u * through[:, -1]  # [R], in [0, total]
    # The first block with mass whose inclusive sum passes the point (rounding can leave the point
    # at the total: then the last block with mass). The sum before it is the previous inclusive
    # sum itself, never a difference, which can round past the point.
    block = _first_passing(through, block_mass, point)  # [R]
    before = jnp.take_along_axis(through, jnp.maximum(block - 1, 0)[:, None], axis=-1)[:, 0]
    before = jnp.where(block > 0, before, 0.0)  # [R]
    inside = jnp.take_along_axis(p, block[:, None, None], axis=1)[:, 0]  # [R, G]
    offset = _first_passing(jnp.cumsum(inside, axis=-1) + before[:, None], inside, point)
    token = block * G + offset
    mass = through[:, -1]
    total = jnp.where(mass > 0, shift + jnp.log(jnp.where(mass > 0, mass, 1.0)), -jnp.inf)
    return token.astype(jnp.int32).reshape(shape), total.reshape(shape)
