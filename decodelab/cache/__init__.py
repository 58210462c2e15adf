"""KV caches: the dense cache (one length per row) and the quantized ones (int8, int4 / KIVI)."""

from decodelab.cache.dense import KVCache, RowView, cache_dtype
from decodelab.cache.quantized import (KINDS, Kivi, KiviKVCache, QuantizedKVCache, init_cache,
                                       max_rewind)

__all__ = ["KINDS", "KVCache", "Kivi", "KiviKVCache", "QuantizedKVCache", "RowView", "cache_dtype",
           "init_cache", "max_rewind"]
