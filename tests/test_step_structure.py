"""The compiled decode step, read as a program: what it must not contain and how much it reads.

Speed regressions show up in a program's structure long before they show up in a benchmark: a
sort of the vocabulary, a transpose or copy of a cache-sized buffer, a cache that is not updated in
place, or attention that reads every slot of ``max_len``. These tests read one step's jaxpr (the
primitives it runs) and its compiled memory statistics (``programs.compiled_memory``: the donated
buffers it reuses, its temporary bytes), and count the attention blocks a step reads.
"""

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
from flax import nnx

import decodelab as dl
from decodelab import sampling
from decodelab.decode import beam, contrastive
from decodelab.decode import generation as decode
from decodelab.decode.request import OutputSpec, RowInputs
from decodelab.model import attention

B, S = 4, 512  # rows, cache slots


@pytest.fixture(scope="module")
def tiny(tiny_config):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    graphdef, weights = nnx.split(model)
    return tiny_config, graphdef, weights


def assert_cache_in_place(program) -> None:
    """``program(max_len) -> (fn, args, static, donated, cache)``: a step compiled for a cache of
    ``max_len`` slots, the argument it donates and the cache inside it.

    The cache's keys and values are updated in place: the compiled step reuses (aliases) at least
    their bytes of its donated buffers, which the rest of the donated state alone cannot reach.
    And no copy, transpose or gather makes a buffer as large as one layer's keys: doubling
    ``max_len`` grows the step's temporary bytes by less than it grows one layer's keys (any
    cache-shaped intermediate grows with the cache; attention reads the live blocks only)."""
    fn, args, static, donated, cache = program(S)
    memory = programs.compiled_memory(fn, *args, **static)
    keys_and_values = cache.k.nbytes + cache.v.nbytes  # [L, B, K, S, H] each
    rest = sum(leaf.nbytes for leaf in jax.tree.leaves(donated)) - keys_and_values
    assert rest < cache.k.nbytes
    assert memory.alias_size_in_bytes >= keys_and_values
    fn, args, static, _, longer = program(2 * S)
    grown = programs.compiled_memory(fn, *args, **static).temp_size_in_bytes
    layer = lambda c: c.k.nbytes // c.k.shape[0]  # noqa: E731  (one layer's keys)
    assert grown - memory.temp_size_in_bytes < layer(longer) - layer(cache)


def model_step(tiny, max_len: int):
    """The cached model step of one token per row, the cache donated."""
    cfg, graphdef, weights = tiny

    def step(weights, tokens, cache):
        model = nnx.merge(graphdef, weights)
        return model(tokens, cache=cache, num_valid=jnp.ones((B,), jnp.int32))

    cache = dl.KVCache.init(cfg, B, max_len).advance(jnp.full((B,), 40, jnp.int32))
    return (jax.jit(step, donate_argnums=2), (weights, jnp.zeros((B, 1), jnp.int32), cache), {},
            cache, cache)


def test_cached_model_step_sorts_nothing(tiny):
    fn, args, *_ = model_step(tiny, S)
    found = programs.primitives(fn, *args)
    assert found["sort"] == 0 and found["top_k"] == 0


def test_cached_model_step_updates_the_cache_in_place_without_copy_or_transpose(tiny):
    assert_cache_in_place(lambda max_len: model_step(tiny, max_len))


def test_greedy_decode_step_updates_the_cache_in_place_without_copy_or_transpose(tiny):
    cfg, graphdef, weights = tiny
    V = cfg.vocab_size

    def program(max_len):
        rows = RowInputs(prompt_lengths=np.full((B,), 10, np.int32),
                         keys=sampling.batch_keys(0, B),
                         params=dl.SamplingParams.greedy().per_row(B, V),
                         eos_mask=np.zeros(V, bool), stop_ids=np.full((0, 1), -1, np.int32))
        state = decode.prefill(weights, np.zeros((B, 16), np.int32), rows,
                               dl.KVCache.init(cfg, B, max_len), graphdef=graphdef,
                               outputs=OutputSpec(8))
        return (decode.DECODE_LOOP.step, (weights, state), dict(graphdef=graphdef), state,
                state.cache)

    assert_cache_in_place(program)


def test_a_prefill_attends_to_the_prompt_not_to_the_cache_capacity(tiny):
    """A 32-token prompt block (the full-matrix path) into a cache of ``S`` slots and of ``8 S``:
    the compiled prefill's floating-point work is the same (within 2%), because the block reads
    only its own ``reach`` of slots."""
    cfg, graphdef, weights = tiny
    V, T = cfg.vocab_size, 32
    rows = RowInputs(prompt_lengths=np.full((B,), T, np.int32), keys=sampling.batch_keys(0, B),
                     params=dl.SamplingParams.greedy().per_row(B, V),
                     eos_mask=np.zeros(V, bool), stop_ids=np.full((0, 1), -1, np.int32))

    def flops(max_len):
        compiled = decode.prefill.lower(weights, np.zeros((B, T), np.int32), rows,
                                        dl.KVCache.init(cfg, B, max_len), graphdef=graphdef,
                                        outputs=OutputSpec(8)).compile()
        analysis = compiled.cost_analysis()
        return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

    small, large = flops(S), flops(8 * S)
    assert small > 0 and large == pytest.approx(small, rel=0.02)


def test_a_prefill_writes_over_a_given_cache_in_place(tiny):
    """``generate`` hands its prefill a cache to write over (a spare: ``cache.spares``): the
    compiled prefill aliases the cache's keys and values and fills no cache-sized buffer, so
    its temporary bytes grow less than one layer's keys when ``max_len`` doubles."""
    cfg, graphdef, weights = tiny
    V = cfg.vocab_size
    rows = RowInputs(prompt_lengths=np.full((B,), 10, np.int32), keys=sampling.batch_keys(0, B),
                     params=dl.SamplingParams.greedy().per_row(B, V),
                     eos_mask=np.zeros(V, bool), stop_ids=np.full((0, 1), -1, np.int32))

    def program(max_len):
        cache = dl.KVCache.init(cfg, B, max_len)
        return (decode.prefill, (weights, np.zeros((B, 16), np.int32), rows, cache),
                dict(graphdef=graphdef, outputs=OutputSpec(8)), cache, cache)

    assert_cache_in_place(program)


def test_beam_step_reorders_beams_without_copying_keys_and_values(tiny):
    cfg, graphdef, weights = tiny
    prompts, width = 2, 2  # B = 4 beam rows

    def program(max_len):
        rows = beam.BeamInputs(prompt_lengths=np.full((prompts,), 10, np.int32),
                               budgets=np.full((prompts,), 8, np.int32),
                               eos_mask=np.zeros(cfg.vocab_size, bool), alpha=np.float32(0.0),
                               min_new_tokens=np.int32(0), usable=np.ones(cfg.vocab_size, bool))
        state = beam.beam_prefill(weights, np.zeros((prompts, 16), np.int32), rows,
                                  graphdef=graphdef, width=width, max_len=max_len,
                                  max_new_tokens=8)
        return (beam.BEAM_LOOP.step, (weights, state), dict(graphdef=graphdef), state,
                state.cache.store)

    assert_cache_in_place(program)


def test_contrastive_step_keeps_a_candidate_without_copying_keys_and_values(tiny):
    """The k-wide step writes the candidates into their own rows and keeps the chosen one by
    copying its newest slot into its prompt's other candidate rows; the context's hidden states
    are updated in place too."""
    cfg, graphdef, weights = tiny
    prompts, k, V = 2, 2, cfg.vocab_size  # B = 4 candidate rows
    rows = RowInputs(prompt_lengths=np.full((prompts,), 10, np.int32),
                     keys=sampling.batch_keys(0, prompts),
                     params=dl.SamplingParams.greedy().per_row(prompts, V),
                     eos_mask=np.zeros(V, bool), stop_ids=np.full((0, 1), -1, np.int32))
    inputs = contrastive.ContrastiveInputs(rows=rows, alpha=np.full((prompts,), 0.6, np.float32),
                                           usable=np.ones(V, bool))

    def program(max_len):
        state = contrastive.contrastive_prefill(weights, np.zeros((prompts, 16), np.int32),
                                                inputs, graphdef=graphdef, top_k=k,
                                                max_len=max_len, outputs=OutputSpec(8))
        return (contrastive.CONTRASTIVE_LOOP.step, (weights, state), dict(graphdef=graphdef),
                state, state.cache)

    assert_cache_in_place(program)


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
