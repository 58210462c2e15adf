"""Data- and tensor-parallel layout on a ``jax.sharding.Mesh``: one table of rules, same programs.

Conventions (every caller relies on them):

- A mesh has two axes, ``data`` (rows of a batch: prompts, slots, training windows) and ``model``
  (tensor parallel, Megatron style), both with Auto axis types: XLA partitions the unchanged
  jit-compiled programs and inserts the collectives (an all-reduce after each attention output and
  MLP down projection). Nothing here writes a collective by hand.
- ``shard(model, mesh)`` places every parameter by the first rule of ``PARAM_RULES`` whose pattern
  matches its path (``blocks/0/attn/q/kernel``); a parameter no rule matches is replicated. A rule
  gives one mesh axis name (or None) per dimension of the parameter. An axis written ``"model?"``
  splits that dimension only when the axis size divides it and replicates it otherwise (KV heads:
  two KV heads cannot be split over four devices); a plain ``"model"`` that does not divide is a
  ValueError naming the axis.
- Embeddings and the output head are split over the vocabulary (``model?``): each device holds V/M
  rows, the lookup is a masked gather plus an all-reduce of ``[B, T, D]``, and the logits come out
  split over V; the sampler all-gathers each step's ``[B, V]`` logits (a row's worth of bytes per
  token, far below any weight matrix). Replicating them instead is a one-line change of the table.
- Transforms compose with ``shard``: ``shard`` of a sharded model lays it out afresh (another
  mesh or other rules re-place it), and every transform that makes a model from a sharded one
  (quantize, prune, ...) returns it on the same mesh by the same rules (``place_like``; the model
  remembers them as ``model.param_rules``). Matrices of the blocks that no rule places (a
  quantized model's projections) are replicated, with a warning when the ``model`` axis splits.
- The sharded model remembers its mesh (``model.mesh``). ``Transformer.__call__`` calls
  ``constrain_inputs`` so that every program that runs the model (generate, speculative decoding,
  beam search, the serving engine, training) lays its token block over ``data`` and its KV cache
  over ``data`` and its KV heads over ``model`` (``cache_spec``) without knowing about meshes. A
  batch of one row is replicated over ``data``; any other batch must be divisible by the
  ``data`` axis: the decoders and the serving engine pad their rows to a multiple of it
  (``data_size``), with padding rows that are never returned.
- The KV cache layout is named by ``CACHE_LAYOUT`` (one letter per dimension, DESIGN.md's
  letters: head-major ``"LBKSH"``, as ``cache.py`` stores it); ``cache_spec`` derives the
  PartitionSpec from it. Every cache variant (float, quantized with its scales, beam search's
  slot table) is constrained leaf by leaf: arrays of that rank by ``cache_spec``, per-row arrays
  over ``data``.
- Several processes (hosts) form one mesh after ``initialize`` (``jax.distributed``). The
  experiment runner (``decodelab.experiment.define_flags`` and ``run_from_flags``) gives every
  sweep program the flags of ``define_flags`` and calls ``initialize_from_flags`` before the
  sweep; a program with its own ``main`` (``experiments/train.py``) calls both itself.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import flags
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from decodelab.config import ModelConfig

AXES = ("data", "model")

# Parameter path pattern (re.search on "blocks/0/attn/q/kernel") -> mesh axis per dimension.
# "model?": split when the model axis divides the dimension, replicate it otherwise.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"attn/q/kernel$", (None, "model", None)),  # [D, N, H]: query heads
    (r"attn/q/bias$", ("model", None)),  # [N, H]
    (r"attn/[kv]/kernel$", (None, "model?", None)),  # [D, K, H]: KV heads when they divide
    (r"attn/[kv]/bias$", ("model?", None)),  # [K, H]
    (r"attn/o/kernel$", ("model", None, None)),  # [N, H, D]: input heads; output all-reduced
    (r"mlp/(gate|up)/kernel$", (None, "model")),  # [D, F]: hidden units
    (r"mlp/(gate|up)/bias$", ("model",)),  # [F]
    (r"mlp/down/kernel$", ("model", None)),  # [F, D]: input units; output all-reduced
    (r"embed/embedding$", ("model?", None)),  # [V, D]: vocabulary
    (r"lm_head/kernel$", (None, "model?")),  # [D, V]: vocabulary
)

# The KV cache's dimensions in order (model/attention.py and cache.py): L layers, B rows, S slots,
# K KV heads, H head dim. Rows go over "data", KV heads over "model" (when the axis divides K).
CACHE_LAYOUT = "LBKSH"


def _axis_size(mesh: Mesh, name: str) -> int:
    return mesh.shape[name]


def make_mesh(data: int = 1, model: int = 1, *, devices: Sequence[jax.Device] | None = None
              ) -> Mesh:
    """A ``data x model`` mesh (Auto axis types) over the first ``data * model`` of ``devices``
    (default ``jax.devices()``: every process's devices after ``initialize``). Neighbouring
    devices share the ``model`` axis, so on several hosts tensor parallelism stays within a host
    when ``model`` divides the devices per host and ``data`` spans the hosts."""
    for name, size in (("data", data), ("model", model)):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise ValueError(f"mesh axis {name!r} must be a positive int, got {size!r}")
    devices = list(jax.devices() if devices is None else devices)
    if data * model > len(devices):
        raise ValueError(f"mesh axes 'data'={data} x 'model'={model} need {data * model} devices, "
                         f"but {len(devices)} are available")
    return jax.make_mesh((data, model), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=devices[:data * model])


def check_mesh(mesh: Any) -> Mesh:
    if not isinstance(mesh, Mesh) or tuple(mesh.axis_names) != AXES:
        raise ValueError(f"mesh must be a jax.sharding.Mesh with axes {AXES} (make_mesh), "
                         f"got {mesh!r}")
    return mesh


def path_name(path: Sequence[Any]) -> str:
    """A pytree key path as ``blocks/0/attn/q/kernel`` (nnx's trailing ``value`` dropped)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def param_spec(name: str, shape: Sequence[int], mesh: Mesh,
               rules: Sequence[tuple[str, tuple[str | None, ...]]] = PARAM_RULES
               ) -> PartitionSpec:
    """The PartitionSpec of the parameter at path ``name`` with ``shape`` under ``rules``."""
    for pattern, axes in rules:
        if not re.search(pattern, name):
            continue
        if len(axes) != len(shape):
            raise ValueError(f"rule {pattern!r} gives {len(axes)} axes but {name} has shape "
                             f"{tuple(shape)}")
        spec = []
        for dim, (size, axis) in enumerate(zip(shape, axes)):
            if axis is None:
                spec.append(None)
                continue
            optional = axis.endswith("?")
            axis = axis.rstrip("?")
            devices = _axis_size(mesh, axis)
            if size % devices == 0:
                spec.append(axis if devices > 1 else None)
            elif optional:
                spec.append(None)
            else:
                raise ValueError(f"mesh axis {axis!r} has size {devices}, which does not divide "
                                 f"dimension {dim} (size {size}) of {name} {tuple(shape)}; use a "
                                 f"{axis!r} axis that divides it")
        return PartitionSpec(*spec) if any(spec) else PartitionSpec()
    return PartitionSpec()


def shard_tree(tree: Any, mesh: Mesh,
               rules: Sequence[tuple[str, tuple[str | None, ...]]] = PARAM_RULES) -> Any:
    """``tree`` (parameters, or an optimizer state holding copies of their paths) with each array
    placed on ``mesh`` by ``rules``. In a run over several processes every process calls it with
    the same values, and ``mesh`` may be this process's devices only (``make_mesh(...,
    devices=jax.local_devices())``: each process then holds its own copy)."""
    mesh = check_mesh(mesh)
    if jax.process_count() > 1:
        # Arrays spread over several processes' devices (a model trained on a mesh spanning the
        # hosts): a full copy on every process first, gathered through the processes'
        # collectives (so every process calls this).
        tree = jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True)
                            if isinstance(x, jax.Array) and not x.is_fully_addressable else x,
                            tree)

    def place(path, leaf):
        sharding = NamedSharding(mesh, param_spec(path_name(path), np.shape(leaf), mesh, rules))
        if jax.process_count() == 1:
            return jax.device_put(leaf, sharding)
        host = np.asarray(leaf)  # the same value on every process (same seed or checkpoint)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree_util.tree_map_with_path(place, tree)


def abstract_on_mesh(tree: Any, mesh: Mesh,
                     rules: Sequence[tuple[str, tuple[str | None, ...]]] = PARAM_RULES) -> Any:
    """``tree``'s arrays (or shapes) as ``jax.ShapeDtypeStruct``s placed on ``mesh`` by
    ``rules``: the target of an Orbax restore that reads each device's shards straight onto it."""
    mesh = check_mesh(mesh)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=NamedSharding(
            mesh, param_spec(path_name(path), np.shape(x), mesh, rules))), tree)


def shard(model: nnx.Module, mesh: Mesh,
          rules: Sequence[tuple[str, tuple[str | None, ...]]] = PARAM_RULES) -> nnx.Module:
    """A copy of ``model`` whose parameters are laid out on ``mesh`` by ``rules``; decode, serve
    and train it as usual. A model already sharded is laid out afresh on ``mesh`` (another mesh
    or other rules re-place it; the same ones give an equal copy). ValueError names a mesh axis
    that does not divide what it must split; a warning names the matrices of the blocks that no
    rule places (a quantized model's projections: the rules split float kernels), which a
    ``model`` axis then holds whole on every device."""
    if not isinstance(model, nnx.Module) or not isinstance(getattr(model, "config", None),
                                                           ModelConfig):
        raise ValueError(f"model must be a Transformer (an nnx.Module with a ModelConfig), got "
                         f"{type(model).__name__}")
    mesh = check_mesh(mesh)
    rules = tuple((pattern, tuple(axes)) for pattern, axes in rules)
    graphdef, state = nnx.split(model)
    unplaced = [name for name in (path_name(p) for p, leaf in
                                  jax.tree_util.tree_leaves_with_path(state) if np.ndim(leaf) > 1)
                if name.startswith("blocks/") and not any(re.search(p, name) for p, _ in rules)]
    if unplaced and _axis_size(mesh, "model") > 1:
        warnings.warn(f"shard: {len(unplaced)} matrices of the blocks match no rule and are "
                      f"replicated over the 'model' axis (size {_axis_size(mesh, 'model')}), "
                      f"e.g. {', '.join(unplaced[:3])}; the rules split float kernels, so a "
                      f"quantized model's projections are held whole by every device",
                      stacklevel=2)
    sharded = nnx.merge(graphdef, shard_tree(state, mesh, rules))
    sharded.mesh = mesh
    sharded.param_rules = rules
    return sharded


def place_like(source: nnx.Module, result: nnx.Module) -> nnx.Module:
    """``result`` laid out as ``source``: on its mesh by the rules it was sharded with (``shard``),
    or unchanged when ``source`` is on one device. Every transform that makes a new model from a
    model (quantize, prune, ...) returns through it, so a sharded model stays sharded."""
    mesh = mesh_of(source)
    if mesh is None:
        return result
    return shard(result, mesh, getattr(source, "param_rules", PARAM_RULES))


def mesh_of(model: nnx.Module) -> Mesh | None:
    """The mesh ``shard`` placed ``model`` on, or None for a model on one device."""
    return getattr(model, "mesh", None)


def data_size(model: nnx.Module) -> int:
    """Devices along the ``data`` axis of ``model``'s mesh, 1 for a model on one device: the rows
    of every batch it runs are padded to a multiple of it (``cache.bucket_rows``)."""
    mesh = mesh_of(model)
    return 1 if mesh is None else _axis_size(mesh, "data")


def cache_spec(cfg: ModelConfig, mesh: Mesh, batch_size: int,
               layout: str = CACHE_LAYOUT) -> PartitionSpec:
    """The KV cache's PartitionSpec: rows (B) over ``data``, KV heads (K) over ``model`` when the
    axis divides them. Otherwise K is left to XLA (``UNCONSTRAINED``): with N query heads split
    M ways, a group of M / K devices shares each KV head, and XLA splits K over that part of the
    axis; pinning K replicated would make it all-gather the cache every step."""
    model = _axis_size(mesh, "model")
    axes = {"B": batch_axis(mesh, batch_size),
            "K": "model" if cfg.n_kv_heads % model == 0 else PartitionSpec.UNCONSTRAINED}
    return PartitionSpec(*(axes.get(letter) for letter in layout))


def batch_axis(mesh: Mesh, batch_size: int) -> str | None:
    """``"data"`` if rows are split over it, None if they are replicated (one row, or a data axis of
    size 1); ValueError for a batch the ``data`` axis does not divide."""
    devices = _axis_size(mesh, "data")
    if devices == 1 or batch_size == 1:
        return None
    if batch_size % devices:
        raise ValueError(f"mesh axis 'data' has size {devices}, which does not divide the batch "
                         f"size {batch_size}; use a batch that is a multiple of it (or one row)")
    return "data"


def constrain_inputs(model: nnx.Module, tokens: jax.Array, cache: Any):
    """``(tokens [B, T], cache)`` constrained to the layout of ``model``'s mesh: rows over
    ``data``, the cache by ``cache_spec``. Unchanged for a model without a mesh."""
    mesh = mesh_of(model)
    if mesh is None:
        return tokens, cache
    B = tokens.shape[0]
    row = batch_axis(mesh, B)
    tokens = jax.lax.with_sharding_constraint(
        tokens, NamedSharding(mesh, PartitionSpec(row, None)))
    if cache is not None:
        kv = NamedSharding(mesh, cache_spec(model.config, mesh, B))

        def constrain(x: jax.Array) -> jax.Array:
            # Any cache variant: its [L, B, K, S, *] arrays (keys, values, a quantized cache's
            # scales) by ``cache_spec``, its per-row arrays ([B], [B, S]) over the rows.
            if x.ndim == len(CACHE_LAYOUT):
                return jax.lax.with_sharding_constraint(x, kv)
            if x.ndim in (1, 2) and x.shape[0] == B:
                spec = PartitionSpec(row, *[None] * (x.ndim - 1))
                return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
            return x

        cache = jax.tree.map(constrain, cache)
    return tokens, cache


# --- Several processes --------------------------------------------------------------------------


def initialize(coordinator_address: str, num_processes: int, process_id: int) -> None:
    """Join ``num_processes`` processes into one JAX runtime (``jax.distributed.initialize``);
    afterwards ``jax.devices()`` lists every process's devices and ``make_mesh`` spans them. CPU
    devices exchange their collectives through gloo. Call before any other JAX operation."""
    if not isinstance(coordinator_address, str) or not re.fullmatch(r".+:\d+",
                                                                    coordinator_address):
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be an int in [0, num_processes={num_processes}), got "
                         f"{process_id!r}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Define ``--coordinator_address``, ``--num_processes`` and ``--process_id`` (once)."""
    if "coordinator_address" in flag_values:
        return
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for a run over "
                        "several processes (jax.distributed); unset: one process.",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_processes", 1, "Number of processes of a multi-process run.",
                         flag_values=flag_values)
    flags.DEFINE_integer("process_id", 0, "This process's index in [0, num_processes).",
                         flag_values=flag_values)


def initialize_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """``initialize`` from the flags of ``define_flags``; nothing when no coordinator is given."""
    if flag_values.coordinator_address is None:
        if flag_values.num_processes != 1:
            raise ValueError(f"--num_processes={flag_values.num_processes} needs "
                             f"--coordinator_address")
        return
    initialize(flag_values.coordinator_address, flag_values.num_processes,
               flag_values.process_id)


def mesh_from_config(section: Any) -> Mesh | None:
    """The mesh of a config's ``mesh`` section (``data``, ``model``); None for 1 x 1 (one device,
    nothing sharded)."""
    if (section.data, section.model) == (1, 1):
        return None
    return make_mesh(data=section.data, model=section.model)
