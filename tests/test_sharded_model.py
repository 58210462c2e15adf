"""A sharded model stays sharded through the functions that rebuild it (with_config, quantize,
prune, ...). On one device: to them a 1 x 1 mesh is a mesh like any other (the 8-device checks
are in test_sharding.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

import decodelab as dl
from decodelab import sharding
from decodelab.compress import dequantized
from decodelab.model import with_config


def test_with_config_keeps_the_mesh_and_the_layout(tiny_config):
    mesh = sharding.make_mesh()
    model = sharding.shard(dl.Transformer(tiny_config, rngs=nnx.Rngs(0)), mesh)
    cfg = model.config.replace(rope_scaling="linear", rope_scaling_factor=2.0)
    scaled = with_config(model, cfg)
    assert scaled.config == cfg
    assert scaled.mesh is mesh
    for before, after in zip(jax.tree.leaves(nnx.state(model)),
                             jax.tree.leaves(nnx.state(scaled)), strict=True):
        assert after.sharding == before.sharding
        np.testing.assert_array_equal(after, before)


def test_with_config_of_a_model_on_one_device_has_no_mesh(tiny_config):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    assert sharding.mesh_of(with_config(model, tiny_config.replace(rope_theta=500.0))) is None


@pytest.mark.parametrize("transform", [
    lambda m: dl.quantize(m, weights="int8"),
    lambda m: dequantized(dl.quantize(m, weights="int8")),
    lambda m: dl.prune(m, sparsity=0.5),
    lambda m: dl.prune_heads(m, 2),
], ids=["quantize", "dequantized", "prune", "prune_heads"])
def test_a_transform_of_a_sharded_model_stays_on_its_mesh_by_its_rules(tiny_config, transform):
    mesh = sharding.make_mesh()
    rules = sharding.PARAM_RULES[:4]
    model = sharding.shard(dl.Transformer(tiny_config, rngs=nnx.Rngs(0)), mesh, rules)
    out = transform(model)
    assert out.mesh is mesh and out.param_rules == model.param_rules == rules
    for leaf in jax.tree.leaves(nnx.state(out)):
        assert leaf.sharding.mesh == mesh
