"""Shared test setup: strict numerics for the whole session and the tiny model config.

Rank promotion raises, so a silent broadcast between arrays of different rank fails a test instead
of computing something unintended; x64 stays off, so everything runs in float32 / int32 as on an
accelerator.
"""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)

from decodelab.config import ModelConfig  # noqa: E402  (after the config updates above)

# DESIGN.md §5: 2 layers, width 64, vocab 512, sequences <= 64; grouped-query attention
# (4 query heads share 2 kv heads).
TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256,
            max_seq_len=64)


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    """The tiny config; derive variants with ``tiny_config.replace(...)``."""
    return ModelConfig(**TINY)
