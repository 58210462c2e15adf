"""Pruning: ``prune(model, method, sparsity, pattern, ...)`` -> a copy whose attention and MLP
projections hold zeros where weights were removed.

Each projection is viewed as the matrix ``W [In, Out]`` that ``decodelab.compress.quantization``
uses (In: the contracted axes flattened). A weight's score is its magnitude ``|W_io|``
(``"magnitude"``) or Wanda's ``|W_io| * ||X_i||_2`` (``"wanda"``, Sun et al. 2023), where
``||X_i||_2`` is the L2 norm of input channel i over every calibration token reaching that
projection: a weight that meets large activations matters more than its size says. The
lowest-scoring weights are zeroed:

- ``pattern="unstructured"``: exactly ``round(sparsity * n)`` weights of each comparison group,
  the group being one output's ``In`` weights (``scope="row"``, Wanda's choice: the paper finds
  per-output comparison essential for Wanda) or the whole matrix (``scope="layer"``, the classic
  magnitude baseline).
- ``pattern="N:M"`` (``"2:4"``, ``"4:8"``): in every group of M consecutive inputs of one output,
  exactly N weights (the N lowest scores) are zeroed: sparsity N / M, the layout sparse tensor
  cores read (on CPU it changes nothing; see below).

Embeddings and the head are untouched. The result is a normal model: its sparsity is zeros in
dense kernels, so it decodes exactly as fast as the dense model. XLA has no sparse kernels and
``jax.experimental.sparse`` is not a performance path; only structured removal (``prune_heads``,
``prune_neurons``) makes a model smaller and faster here. ``masks(model)`` gives each
projection's zero pattern; ``update_mask(model)`` holds it through recovery fine-tuning
(``train.train(init=pruned, update_mask=...)``). A pruned model pruned again keeps its zeros
(``decodelab.compress``'s docstring: transforms of transformed models).

Structured removal. ``prune_heads`` removes whole key/value head groups (a key/value head with the
query heads that share it, so grouped-query attention stays consistent and the KV cache shrinks
with the heads) and ``prune_neurons`` MLP hidden units, the same number in every layer (chosen per
layer by importance), so the result is a ``Transformer`` of a smaller ``ModelConfig``: fewer
weights to read per token, hence faster decoding. Importance: ``"norm"`` (weight norms, no data)
or ``"taylor"`` (the loss's first-order change, on calibration tokens). Its logits equal the dense
model's with those heads or units masked (``mask_heads`` / ``mask_neurons``). ALiBi and T5 bias
models are refused: their position parameters are per head.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.checks import check_number, check_one_of
from decodelab.compress.patterns import PATTERNS, SCOPES, mask_of, n_and_m, scores, zeros_asked
from decodelab.compress.quantization import (as_matrix, calibrate, check_calibration,
                                             check_float_model, layout, projections)
from decodelab.model import Transformer
from decodelab.model.losses import token_nll
from decodelab.sharding import place_like

METHODS = ("magnitude", "wanda")


def _check_args(model, method, sparsity, pattern, calibration, scope) -> None:
    check_float_model(model, "prune")
    check_one_of("method", method, METHODS)
    check_one_of("pattern", pattern, PATTERNS)
    check_one_of("scope", scope, SCOPES)
    check_number("sparsity", sparsity, 0, 1, open_high=True)
    n_m = n_and_m(pattern)
    if n_m is not None:
        if not math.isclose(sparsity, n_m[0] / n_m[1]):
            raise ValueError(f"sparsity must be {n_m[0] / n_m[1]:g} for pattern={pattern!r} (N "
                             f"of every M weights), got {sparsity!r}")
        if scope != "row":
            raise ValueError(f"scope must be 'row' for pattern={pattern!r} (its groups run along "
                             f"one output's inputs), got {scope!r}")
    if method == "wanda":
        check_calibration(calibration, "method='wanda' (its score weighs each input by its "
                                       "activations)")
    elif calibration is not None:
        raise ValueError("calibration is only used by method='wanda', got method='magnitude' "
                         "with calibration tokens")


def prune(model: Transformer, method: str = "magnitude", sparsity: float = 0.5,
          pattern: str = "unstructured", calibration=None, *, scope: str = "row") -> Transformer:
    """A copy of ``model`` with the lowest-scoring weights of every attention and MLP projection
    set to zero (module docstring). ``calibration``: token windows ``[B, T]`` for Wanda. A model
    already pruned keeps its zeros (they score lowest); ValueError when a projection holds more
    zeros than the request leaves, a warning when some comparison groups do."""
    _check_args(model, method, sparsity, pattern, calibration, scope)
    targets = projections(model, embeddings=False)
    for path, module in targets:
        w = as_matrix(module)[0]
        held, asked = int(jnp.sum(w == 0)), zeros_asked(w.shape, sparsity, pattern, scope)
        if held > asked:
            raise ValueError(f"sparsity={sparsity!r} with pattern={pattern!r} leaves {asked} "
                             f"zeros in {'.'.join(map(str, path))}, which already holds {held} "
                             f"(sparsity {held / w.size:.4g}): pruned weights cannot come back; "
                             f"prune the unpruned model, or ask for at least that sparsity")
    norms = calibrate(model, targets, "norm", calibration) if method == "wanda" else {}
    out, over = nnx.clone(model), []
    for path, module in targets:
        w, _, kernel_shape = as_matrix(module)
        keep = mask_of(scores(w, norms.get(path)), sparsity, pattern, scope) & (w != 0)
        if int(jnp.sum(~keep)) > zeros_asked(w.shape, sparsity, pattern, scope):
            over.append(f"{'.'.join(map(str, path))}: {float(jnp.mean(~keep)):.4g}")
        target = functools.reduce(lambda m, k: m[k] if isinstance(k, int) else getattr(m, k),
                                  path, out)
        target.kernel[...] = jnp.where(keep, w, 0).reshape(kernel_shape).astype(w.dtype)
    if over:
        warnings.warn(f"prune: model's existing zeros exceed what sparsity={sparsity!r} with "
                      f"pattern={pattern!r} asks in some groups, and stay: {', '.join(over)}",
                      stacklevel=2)
    return place_like(model, out)


def masks(model: Transformer) -> dict[tuple, jax.Array]:
    """Each attention and MLP projection's mask of nonzero weights, in its kernel's shape (a
    quantized projection's: of its dequantized kernel)."""
    return {path: as_matrix(m)[0].reshape(layout(m)[1]) != 0
            for path, m in projections(model, False)}


def sparsity_of(model: Transformer) -> dict[str, float]:
    """The fraction of zero weights of each attention and MLP projection, by dotted path (a
    quantized projection's: of its dequantized kernel)."""
    return {".".join(map(str, path)): float(jnp.mean(as_matrix(module)[0] == 0))
            for path, module in projections(model, False)}


# --- Structured removal: whole attention head groups and MLP neurons ------------------------------

IMPORTANCES = ("norm", "taylor")
# Position encodings whose parameters do not depend on the number of heads (ALiBi's slopes and
# T5's bias table are per head).
HEAD_FREE_POSITIONS = ("rope", "learned", "sinusoidal", "nope")


def _check_importance(model, call: str, importance: str, calibration) -> None:
    check_float_model(model, call)
    check_one_of("importance", importance, IMPORTANCES)
    if importance == "taylor":
        check_calibration(calibration, "importance='taylor' (it takes the loss's gradient on "
                                       "those tokens)")


def _taylor(model: Transformer, calibration) -> nnx.State:
    """``|sum(W * dL/dW)|`` terms: the gradient of the mean next-token loss on ``calibration``
    with respect to every parameter, times the parameter (elementwise)."""
    tokens = jnp.asarray(calibration, jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
        m = nnx.merge(graphdef, params, rest)
        return jnp.mean(token_nll(m(tokens[:, :-1]), tokens[:, 1:]))

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda w, g: w * g, params, grads)


def head_importance(model: Transformer, importance: str = "norm", calibration=None) -> np.ndarray:
    """``[L, K]``: each layer's key/value head group (the group's query heads with their shared key
    and value head). ``"norm"``: the L2 norm of all the group's weights (its query, key, value
    and output slices). ``"taylor"``: the first-order estimate of the loss change when the group
    is removed, ``|sum over its output slice of W * dL/dW|`` (a head's contribution is linear in
    its output slice, so this is the derivative with respect to a mask on the head, Michel et al.
    2019), on ``calibration`` tokens."""
    _check_importance(model, "head_importance", importance, calibration)
    cfg = model.config
    K, G = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
    taylor = _taylor(model, calibration) if importance == "taylor" else None
    rows = []
    for i, block in enumerate(model.blocks):
        a = block.attn
        if taylor is None:
            squares = [jnp.sum(jnp.square(a.q.kernel[...]), axis=(0, 2)).reshape(K, G).sum(1),
                       jnp.sum(jnp.square(a.o.kernel[...]), axis=(1, 2)).reshape(K, G).sum(1),
                       jnp.sum(jnp.square(a.k.kernel[...]), axis=(0, 2)),
                       jnp.sum(jnp.square(a.v.kernel[...]), axis=(0, 2))]
            rows.append(jnp.sqrt(sum(squares)))
        else:
            wg = taylor["blocks"][i]["attn"]["o"]["kernel"][...]  # [N, H, D]
            rows.append(jnp.abs(jnp.sum(wg, axis=(1, 2)).reshape(K, G).sum(1)))
    return np.asarray(jnp.stack(rows))


def neuron_importance(model: Transformer, importance: str = "norm",
                      calibration=None) -> np.ndarray:
    """``[L, F]``: each MLP hidden unit. ``"norm"``: the L2 norm of its weights (its input columns
    and its output row); ``"taylor"``: ``|sum over its output row of W * dL/dW|`` (as for heads)."""
    _check_importance(model, "neuron_importance", importance, calibration)
    taylor = _taylor(model, calibration) if importance == "taylor" else None
    rows = []
    for i, block in enumerate(model.blocks):
        mlp = block.mlp
        if taylor is None:
            squares = jnp.sum(jnp.square(mlp.down.kernel[...]), axis=1)  # [F]
            for name in ("gate", "up"):
                if hasattr(mlp, name):
                    squares = squares + jnp.sum(jnp.square(getattr(mlp, name).kernel[...]), 0)
            rows.append(jnp.sqrt(squares))
        else:
            rows.append(jnp.abs(jnp.sum(taylor["blocks"][i]["mlp"]["down"]["kernel"][...], 1)))
    return np.asarray(jnp.stack(rows))


def _drop_lowest(scores_: np.ndarray, remove: int) -> np.ndarray:
    """``[L, U] bool``: per layer, all units but the ``remove`` of lowest score (ties: the lower
    index goes first, so the choice is deterministic)."""
    order = np.argsort(scores_, axis=1, kind="stable")
    keep = np.ones(scores_.shape, bool)
    np.put_along_axis(keep, order[:, :remove], False, axis=1)
    return keep


def _count(name: str, value, total: int, unit: str, per: int = 1) -> int:
    """Units to remove per layer: ``value`` an int count of ``per``-sized pieces of a unit (a
    multiple of ``per``) or a fraction in (0, 1) of the ``total`` units; at least one unit stays."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be an int count or a fraction in (0, 1), got {value!r}")
    if isinstance(value, float):
        if not 0 < value < 1:
            raise ValueError(f"{name} as a fraction must be in (0, 1), got {value!r}")
        count = round(value * total)
    else:
        if value % per:
            raise ValueError(f"{name} must be a multiple of {per} (a {unit} is {per} of them), "
                             f"got {value}")
        count = value // per
    if not 0 <= count < total:
        raise ValueError(f"{name} must leave at least one {unit} in every layer (there are "
                         f"{total}), got {name}={value!r}")
    return count


# (projection, parameter) -> (what its axis indexes, the axis): query heads or key/value groups of
# the attention projections, hidden units of the MLP's.
_HEAD_AXES = {("q", "kernel"): ("query", 1), ("q", "bias"): ("query", 0),
              ("o", "kernel"): ("query", 0), ("k", "kernel"): ("group", 1),
              ("k", "bias"): ("group", 0), ("v", "kernel"): ("group", 1),
              ("v", "bias"): ("group", 0)}
_UNIT_AXES = {("gate", "kernel"): 1, ("gate", "bias"): 0, ("up", "kernel"): 1, ("up", "bias"): 0,
              ("down", "kernel"): 0}


def _slice_params(model: Transformer, cfg, keep_heads: np.ndarray | None,
                  keep_neurons: np.ndarray | None) -> Transformer:
    """A model of config ``cfg`` holding ``model``'s weights restricted to the query heads
    ``keep_heads [L, N]`` (whole key/value groups) and the hidden units ``keep_neurons [L, F]``
    (None: all of them)."""
    G = model.config.n_heads // model.config.n_kv_heads
    out = Transformer(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(out, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = variable[...]
        key = tuple(path[3:5])
        if keep_heads is not None and path[2:3] == ("attn",) and key in _HEAD_AXES:
            what, axis = _HEAD_AXES[key]
            heads = np.flatnonzero(keep_heads[path[1]])
            index = heads if what == "query" else heads[::G] // G
            value = jnp.take(value, index, axis=axis)
        if keep_neurons is not None and path[2:3] == ("mlp",) and key in _UNIT_AXES:
            value = jnp.take(value, np.flatnonzero(keep_neurons[path[1]]), axis=_UNIT_AXES[key])
        flat[path][...] = value
    nnx.update(out, nnx.from_flat_state(flat))
    return out


def heads_to_keep(model, heads_per_layer, importance, calibration) -> np.ndarray:
    """``[L, N] bool``: the query heads kept, in whole key/value groups."""
    cfg = model.config
    if cfg.position not in HEAD_FREE_POSITIONS:
        raise ValueError(f"model's position encoding must be one of {HEAD_FREE_POSITIONS} to "
                         f"remove heads (its parameters are per head), got {cfg.position!r}")
    G = cfg.n_heads // cfg.n_kv_heads
    groups = _count("heads_per_layer", heads_per_layer, cfg.n_kv_heads,
                    "key/value head group of query heads", per=G)
    keep = _drop_lowest(head_importance(model, importance, calibration), groups)
    return np.repeat(keep, G, axis=1)


def neurons_to_keep(model, fraction, importance, calibration) -> np.ndarray:
    """``[L, F] bool``: the MLP hidden units kept."""
    count = _count("fraction", fraction, model.config.d_ff, "hidden unit")
    return _drop_lowest(neuron_importance(model, importance, calibration), count)


def prune_heads(model: Transformer, heads_per_layer: int | float = 0.25, *,
                importance: str = "norm", calibration=None) -> Transformer:
    """A smaller model without the least important key/value head groups of every layer (the
    same count in each layer, so the config stays one shape and the KV cache shrinks with it):
    ``heads_per_layer`` query heads (a multiple of the group size) or a fraction of the groups.
    Importance per group: ``head_importance``. Logits equal ``mask_heads`` of the same choice."""
    check_float_model(model, "prune_heads")
    keep = heads_to_keep(model, heads_per_layer, importance, calibration)
    cfg = model.config
    N = int(keep[0].sum())
    new = cfg.replace(n_heads=N, n_kv_heads=N // (cfg.n_heads // cfg.n_kv_heads),
                      head_dim=cfg.head_dim, d_ff=cfg.d_ff)
    return place_like(model, _slice_params(model, new, keep, None))


def prune_neurons(model: Transformer, fraction: int | float = 0.25, *, importance: str = "norm",
                  calibration=None) -> Transformer:
    """A smaller model without the least important MLP hidden units of every layer (the same
    count in each layer): ``fraction`` of ``d_ff`` or an int count. Importance per unit:
    ``neuron_importance``. Logits equal ``mask_neurons`` of the same choice."""
    check_float_model(model, "prune_neurons")
    keep = neurons_to_keep(model, fraction, importance, calibration)
    cfg = model.config
    new = cfg.replace(d_ff=int(keep[0].sum()), head_dim=cfg.head_dim)
    return place_like(model, _slice_params(model, new, None, keep))


def _check_keep(name: str, keep, shape: tuple[int, int]) -> None:
    """``keep`` must be ``[L, U]`` (one weight or flag per layer and unit)."""
    if np.shape(keep) != shape:
        raise ValueError(f"{name} must have shape [layers, units] = {list(shape)}, got "
                         f"{list(np.shape(keep))}")


def mask_heads(model: Transformer, keep: np.ndarray) -> Transformer:
    """A copy whose query heads not in ``keep [L, N]`` contribute nothing (their output-projection
    slices zeroed): the dense model ``prune_heads`` must equal."""
    check_float_model(model, "mask_heads")
    _check_keep("keep", keep, (model.config.n_layers, model.config.n_heads))
    out = nnx.clone(model)
    for i, block in enumerate(out.blocks):
        o = block.attn.o.kernel
        o[...] = o[...] * jnp.asarray(keep[i], o[...].dtype)[:, None, None]
    return place_like(model, out)


def mask_neurons(model: Transformer, keep: np.ndarray) -> Transformer:
    """A copy whose hidden units not in ``keep [L, F]`` contribute nothing (their rows of the
    down projection zeroed): the dense model ``prune_neurons`` must equal."""
    check_float_model(model, "mask_neurons")
    _check_keep("keep", keep, (model.config.n_layers, model.config.d_ff))
    out = nnx.clone(model)
    for i, block in enumerate(out.blocks):
        down = block.mlp.down.kernel
        down[...] = down[...] * jnp.asarray(keep[i], down[...].dtype)[:, None]
    return place_like(model, out)


def update_mask(model: Transformer):
    """A tree like ``nnx.state(model)``: 1 where training may change a parameter, 0 at each
    zero weight of the attention and MLP projections (``train.train(update_mask=...)``: recovery
    fine-tuning that keeps the pruned weights at zero)."""
    check_float_model(model, "update_mask")
    pruned = {tuple(path) + ("kernel",) for path, _ in projections(model, False)}

    def leaf(key_path, value):
        names = tuple(getattr(k, "key", getattr(k, "name", None)) for k in key_path)
        if names[:-1] in pruned:  # the last key is the Variable's value
            return (value != 0).astype(value.dtype)
        return jnp.ones((), value.dtype)

    return jax.tree_util.tree_map_with_path(leaf, nnx.state(model))
