"""The compiled decode step, read as a program: what it must not contain and how much it reads.

Speed regressions show up in the compiled text long before they show up in a benchmark: a sort of
the vocabulary, a transpose or copy of a cache-sized buffer, a cache that is not updated in place,
or attention that reads every slot of ``max_len``. These tests read the optimized HLO of one step
(``jax.jit(...).lower(...).compile().as_text()``) and count the attention blocks a step reads.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab import sampling
from decodelab.decode import beam
from decodelab.decode import generation as decode
from decodelab.decode.request import OutputSpec, RowInputs
from decodelab.model import attention

B, S = 4, 512  # rows, cache slots: S makes the cache the only buffer of its shape


@pytest.fixture(scope="module")
def tiny(tiny_config):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    graphdef, weights = nnx.split(model)
    return tiny_config, graphdef, weights


def parameters(hlo: str) -> list[str]:
    """The entry computation's parameter shapes, in order."""
    layout = re.search(r"entry_computation_layout=\{\((.*?)\)->", hlo.splitlines()[0]).group(1)
    layout = re.sub(r"/\*index=\d+\*/", "", layout)
    shapes, depth, current = [], 0, ""
    for char in layout:
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        if char == "," and depth == 0:
            shapes.append(current.strip())
            current = ""
        else:
            current += char
    return shapes + [current.strip()]


def aliased_parameters(hlo: str) -> set[int]:
    """Parameters whose buffer the program reuses for an output (input/output aliasing)."""
    header = hlo.splitlines()[0]
    return {int(p) for p in re.findall(r"\{[\d,]*\}: \((\d+), \{\}, may-alias\)", header)}


def large_ops(hlo: str, elements: int, ops: tuple[str, ...]) -> list[str]:
    """Instructions with one of ``ops`` whose result has at least ``elements`` elements."""
    found = []
    for line in hlo.splitlines():
        match = re.search(r"= \w+\[([\d,]*)\]\S* (\w+)\(", line)
        if match and match.group(2) in ops:
            dims = [int(d) for d in match.group(1).split(",") if d]
            if math.prod(dims) >= elements:
                found.append(line.strip())
    return found


def sorts(hlo: str) -> list[str]:
    return [line.strip() for line in hlo.splitlines() if re.search(r"\bsort\(", line)]


def assert_cache_in_place(hlo: str, cfg, rows: int) -> None:
    """The cache's keys and values are parameters aliased to outputs (updated in place), and no
    copy, transpose or gather makes a buffer as large as one layer's keys."""
    shape = f"f32[{cfg.n_layers},{rows},{cfg.n_kv_heads},{S},{cfg.head_dim}]"  # [L, B, K, S, H]
    cache_params = [i for i, p in enumerate(parameters(hlo)) if p.startswith(shape + "{")]
    assert len(cache_params) == 2  # keys and values
    assert set(cache_params) <= aliased_parameters(hlo)
    layer = rows * cfg.n_kv_heads * S * cfg.head_dim
    assert large_ops(hlo, layer, ("copy", "transpose", "gather")) == []


@pytest.fixture(scope="module")
def model_step_hlo(tiny):
    cfg, graphdef, weights = tiny

    def step(weights, tokens, cache):
        model = nnx.merge(graphdef, weights)
        return model(tokens, cache=cache, num_valid=jnp.ones((B,), jnp.int32))

    cache = dl.KVCache.init(cfg, B, S).advance(jnp.full((B,), 40, jnp.int32))
    lowered = jax.jit(step, donate_argnums=2).lower(weights, jnp.zeros((B, 1), jnp.int32), cache)
    return lowered.compile().as_text()


def test_cached_model_step_sorts_nothing(model_step_hlo):
    assert sorts(model_step_hlo) == []


def test_cached_model_step_updates_the_cache_in_place_without_copy_or_transpose(tiny,
                                                                                model_step_hlo):
    assert_cache_in_place(model_step_hlo, tiny[0], B)


def test_greedy_decode_step_updates_the_cache_in_place_without_copy_or_transpose(tiny):
    cfg, graphdef, weights = tiny
    V = cfg.vocab_size
    rows = RowInputs(prompt_lengths=np.full((B,), 10, np.int32), keys=sampling.batch_keys(0, B),
                     params=dl.SamplingParams.greedy().per_row(B, V), eos_mask=np.zeros(V, bool),
                     stop_ids=np.full((0, 1), -1, np.int32))
    state = decode.prefill(weights, np.zeros((B, 16), np.int32), rows, graphdef=graphdef,
                           max_len=S, outputs=OutputSpec(8))
    hlo = decode.DECODE_LOOP.step.lower(weights, state, graphdef=graphdef).compile().as_text()
    assert_cache_in_place(hlo, cfg, B)


def test_beam_step_reorders_beams_without_copying_keys_and_values(tiny):
    cfg, graphdef, weights = tiny
    prompts, width = 2, 2  # B = 4 beam rows
    state = beam._beam_prefill(
        weights, np.zeros((prompts, 16), np.int32), np.full((prompts,), 10, np.int32),
        np.full((prompts,), 8, np.int32), np.zeros(cfg.vocab_size, bool), np.float32(0.0),
        np.int32(0), graphdef=graphdef, width=width, max_len=S, max_new_tokens=8)
    hlo = beam.BEAM_LOOP.step.lower(weights, state, graphdef=graphdef).compile().as_text()
    assert_cache_in_place(hlo, cfg, prompts * width)


# --- Attention reads live slots only -------------------------------------------------------------


@pytest.fixture
def block_reads(monkeypatch):
    """The start slot of every ``KVCache.read`` a computation runs (one per loop trip and layer),
    with 16-slot attention blocks."""
    starts = []
    read = dl.KVCache.read

    def counted(self, layer, start, size):
        jax.debug.callback(lambda s: starts.append(int(s)), start)
        return read(self, layer, start, size)

    monkeypatch.setattr(dl.KVCache, "read", counted)

    def run(model, lengths, num_valid, max_len):
        starts.clear()
        cache = dl.KVCache.init(model.config, len(lengths), max_len).advance(jnp.asarray(lengths))
        tokens = jnp.zeros((len(lengths), 1), jnp.int32)
        model(tokens, cache=cache, num_valid=jnp.asarray(num_valid),
              blocking=attention.Blocking(slots=16))
        jax.effects_barrier()
        return list(starts)

    return run


def test_a_step_reads_the_same_blocks_at_max_len_2048_as_at_256(tiny_config, block_reads):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    # 40 tokens cached, the 41st written now: 41 live slots = 3 blocks of 16, in each of 2 layers.
    expected = [0, 16, 32] * tiny_config.n_layers
    assert block_reads(model, [40, 12], [1, 1], max_len=2048) == expected
    assert block_reads(model, [40, 12], [1, 1], max_len=256) == expected


def test_a_stopped_row_does_not_add_blocks(tiny_config, block_reads):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    # Row 1 holds 200 tokens but feeds nothing (num_valid 0): only row 0's 41 slots count.
    assert block_reads(model, [40, 200], [1, 0], max_len=256) == [0, 16, 32] * tiny_config.n_layers
