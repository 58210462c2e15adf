"""A model split into its static structure and its weights for the compiled programs.

Every compiled decode program takes the model's ``GraphDef`` as a static argument, and ``jax.jit``
hashes its static arguments on every call to find the compiled program. An ``nnx`` GraphDef
hashes its whole node list each time: 0.3 ms for the ``small`` preset and 2.1 ms for SmolLM2 on
a CPU core, paid by each program a call runs (a serving engine: twice per step). ``split``
returns a GraphDef whose hash is computed once, so those calls find their program at a
dictionary's cost. It is an ``nnx`` GraphDef in every other respect (``nnx.merge`` takes it);
two of them are equal when their structures are.
"""

from __future__ import annotations

import jax
from flax import nnx
from flax.nnx import graphlib


class HashedGraphDef(graphlib.GraphDef):
    """An ``nnx`` GraphDef that keeps its hash (``split``)."""

    __slots__ = ("hash_value",)

    def __hash__(self) -> int:
        return self.hash_value


jax.tree_util.register_static(HashedGraphDef)


def split(model: nnx.Module) -> tuple[HashedGraphDef, nnx.State]:
    """``nnx.split(model)``, the GraphDef hashed once (module docstring)."""
    graphdef, weights = nnx.split(model)
    hashed = HashedGraphDef(nodes=graphdef.nodes, attributes=graphdef.attributes,
                            num_leaves=graphdef.num_leaves)
    object.__setattr__(hashed, "hash_value", hash(graphdef))
    return hashed, weights
