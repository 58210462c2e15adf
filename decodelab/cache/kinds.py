"""The cache kinds a caller names with ``kv_cache=``: None (a float ``KVCache``), ``"int8"``
(``QuantizedKVCache``), ``"int4"`` (``KiviKVCache`` with ``Kivi()``) or a ``Kivi`` for other
sizes. Decoders, speculative decoding, beam search and the serving engine pick a cache only here
(``init_cache``), and ask what a kind allows through these functions, never by its class.
"""

from __future__ import annotations

import jax.numpy as jnp

from decodelab.cache.base import Cache
from decodelab.cache.dense import KVCache
from decodelab.cache.kivi import Kivi, KiviKVCache
from decodelab.cache.quantized import QuantizedKVCache
from decodelab.config import ModelConfig

KINDS = ("int8", "int4")  # kv_cache names; "int4" is Kivi()


def check_kind(name: str, kind, *, shared_by: str | None = None) -> None:
    """Raise unless ``kind`` is None (a float cache), one of ``KINDS`` or a ``Kivi``. With
    ``shared_by`` (a caller whose rows share history, e.g. "beam search"), also unless rows of the
    kind can read each other's slots (``Cache.gather``): a KIVI cache's key groups and float ring
    follow one row's own history."""
    if kind is not None and not isinstance(kind, Kivi) and kind not in KINDS:
        raise ValueError(f"{name} must be None (float) or one of {KINDS}, got {kind!r} (or a "
                         f"cache.Kivi for int4 with other group sizes)")
    if shared_by is not None and isinstance(resolve(kind), Kivi):
        raise ValueError(f"{name} must be None or 'int8' for {shared_by}, got {kind!r}: KIVI's "
                         f"key groups and float ring follow one row's own history, and "
                         f"{shared_by} shares history across rows")


def resolve(kind):
    """``kind`` with ``"int4"`` spelled out as ``Kivi()``."""
    return Kivi() if kind == "int4" else kind


def bytes_per_token(cfg: ModelConfig, kind) -> int:
    """Bytes the cache holds per token (keys and values of every layer and kv head, with their
    scales and zero points; a ``Kivi`` ring's constant float slots are not counted)."""
    L, K, H = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
    kind = resolve(kind)
    if kind is None:
        return 2 * L * K * H * jnp.dtype(cfg.dtype).itemsize
    if isinstance(kind, Kivi):
        bits = 4 * H + 64 * H / kind.group_size + 4 * H + 64 * kind.value_groups(H)
        return round(L * K * bits / 8)
    return 2 * L * K * (H * 8 + 32) // 8


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, kind=None) -> Cache:
    """A float ``KVCache`` (``kind`` None), an int8 ``QuantizedKVCache`` or, for ``"int4"`` or a
    ``Kivi``, a ``KiviKVCache``."""
    check_kind("kind", kind)
    kind = resolve(kind)
    if kind is None:
        return KVCache.init(cfg, batch_size=batch_size, max_len=max_len)
    if isinstance(kind, Kivi):
        return KiviKVCache.init(cfg, batch_size, max_len, kind)
    return QuantizedKVCache.init(cfg, batch_size, max_len, kind)


def max_rewind(kind) -> int | None:
    """The deepest exact rewind of a cache of ``kind`` (None: any)."""
    kind = resolve(kind)
    return kind.max_rewind if isinstance(kind, Kivi) else None
