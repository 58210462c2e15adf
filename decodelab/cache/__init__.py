"""KV caches behind one ``Cache`` protocol (``base``): the dense cache (``dense``, one length per
row), the quantized ones (``quantized``: int8; ``kivi``: int4 in KIVI's layout), the beam view
(``beam``) and the paged view (``paged``); the kinds a caller names with ``kv_cache=`` (``kinds``),
bucket lengths (``buckets``) and the spare cache a finished call leaves for the next (``spares``)."""

# The protocol
from decodelab.cache.base import Cache, CacheWrapper, FloatTail

# The caches
from decodelab.cache.dense import KVCache, RowView, cache_dtype
from decodelab.cache.quantized import QuantizedKVCache
from decodelab.cache.kivi import Kivi, KiviKVCache
from decodelab.cache.beam import BeamCache
from decodelab.cache.paged import PagedKVCache, pages_for

# Choosing one
from decodelab.cache.kinds import KINDS, bytes_per_token, check_kind, init_cache, max_rewind

# Bucket lengths
from decodelab.cache.buckets import bucket_length, bucket_rows, round_up

__all__ = ["BeamCache", "Cache", "CacheWrapper", "FloatTail", "KINDS", "KVCache", "Kivi",
           "KiviKVCache", "PagedKVCache", "QuantizedKVCache", "RowView", "bucket_length",
           "bucket_rows", "bytes_per_token", "cache_dtype", "check_kind", "init_cache",
           "max_rewind", "pages_for", "round_up"]
