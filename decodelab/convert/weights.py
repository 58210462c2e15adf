"""Checkpoint tensors -> a decodelab Transformer, every shape checked against the config.

A converter reads a file's tensors through ``TensorSource.take``, which checks each tensor against
the shape the checkpoint's own config implies (so a file that disagrees with its metadata fails
naming the tensor), maps them to decodelab's parameter layout, and ``build_transformer`` places
them, refusing a missing, repeated or misshapen parameter and, through ``TensorSource.check_used``,
any tensor of the file it did not use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.config import ModelConfig
from decodelab.model import Transformer, abstract_transformer


class TensorSource:
    """Named tensors of one checkpoint, read on demand as float32 NumPy arrays.

    ``read(name)`` returns the tensor ``name`` of the file; ``names`` are all tensor names in it;
    ``ignored`` are names a model never uses (e.g. a saved causal-mask buffer).
    """

    def __init__(self, source: str, names: Iterable[str], read: Callable[[str], np.ndarray],
                 ignored: Callable[[str], bool] = lambda name: False):
        self.source = source
        self.names = set(names)
        self._read = read
        self._ignored = ignored
        self._used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.names

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name`` as float32, which must have ``shape`` (what the config implies)."""
        if name not in self.names:
            raise ValueError(f"{self.source} must hold tensor {name!r} (shape {shape}), got a file "
                             "without it")
        array = np.asarray(self._read(name), dtype=np.float32)
        if array.shape != tuple(shape):
            raise ValueError(f"{self.source}: tensor {name!r} must have shape {tuple(shape)} (from "
                             f"the checkpoint's config), got {array.shape}")
        self._used.add(name)
        return array

    def check_used(self) -> None:
        """Raise if the file holds tensors the conversion did not use (another architecture)."""
        unused = sorted(n for n in self.names - self._used if not self._ignored(n))
        if unused:
            raise ValueError(f"{self.source} holds tensors this architecture does not use: "
                             f"{unused[:8]}{' ...' if len(unused) > 8 else ''}")


def build_transformer(cfg: ModelConfig, params: Mapping[str, np.ndarray]) -> Transformer:
    """A Transformer of ``cfg`` with ``params`` (dotted parameter paths such as
    ``blocks.0.attn.q.kernel`` -> float32 arrays in decodelab's layout), all of them given."""
    graphdef, state = abstract_transformer(cfg)
    flat = nnx.to_flat_state(state)
    expected = {".".join(map(str, path)): variable for path, variable in flat}
    missing = sorted(set(expected) - set(params))
    unknown = sorted(set(params) - set(expected))
    if missing or unknown:
        raise ValueError(f"params must be exactly the model's parameters; missing {missing}, "
                         f"unknown {unknown}")
    filled = []
    for path, variable in flat:
        name = ".".join(map(str, path))
        value = params[name]
        if value.shape != variable.shape:
            raise ValueError(f"params[{name!r}] must have shape {variable.shape}, got "
                             f"{value.shape}")
        filled.append((path, variable.replace(jnp.asarray(value, jnp.float32))))
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
