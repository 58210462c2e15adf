"""measure.compiles: counting compilations, and dropping compiled programs before a long process
reaches the kernel's memory-map limit (each compiled XLA:CPU program holds maps of its own)."""

import sys

import jax
import jax.numpy as jnp
import pytest

from decodelab.measure import compiles


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_memory_maps_reads_this_process_and_the_limit():
    held, limit = compiles.memory_maps()
    assert 0 < held < limit


def test_each_compiled_program_holds_maps_that_dropping_it_returns():
    if compiles.memory_maps() is None:
        pytest.skip("no /proc here")
    programs = [jax.jit(lambda x, k=k: jnp.sin(x) * k + jnp.cumsum(x)) for k in range(20)]
    jax.clear_caches()
    before = compiles.memory_maps()[0]
    for program in programs:
        program(jnp.ones(8)).block_until_ready()
    held = compiles.memory_maps()[0]
    assert held > before + 20  # at least one map per program
    jax.clear_caches()
    assert compiles.memory_maps()[0] < held


@pytest.mark.parametrize("held, dropped", [(40, False), (60, True)])
def test_programs_are_dropped_past_the_fraction_of_the_limit(monkeypatch, held, dropped):
    monkeypatch.setattr(compiles, "memory_maps", lambda: (held, 100))
    square = jax.jit(lambda x: x * x)
    square(jnp.ones(3))
    assert compiles.release_near_map_limit(0.5) is dropped
    with compiles.count_compiles() as counts:
        square(jnp.ones(3))
    assert counts["<lambda>"] == int(dropped)  # dropped: compiled again


def test_no_reading_of_the_maps_drops_nothing(monkeypatch):
    monkeypatch.setattr(compiles, "memory_maps", lambda: None)
    assert compiles.release_near_map_limit() is False


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 2.0])
def test_a_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match=rf"fraction must be in \(0, 1\), got {fraction}"):
        compiles.release_near_map_limit(fraction)
