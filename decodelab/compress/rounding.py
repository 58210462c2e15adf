"""One matrix's integer form, numbered by qwix: round to nearest, GPTQ and AWQ
(``decodelab.compress.quantization`` says what it takes from qwix and why the GPTQ loop is its
own)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from decodelab import optional


def qwix_modules():
    """The qwix package (the ``quant`` extra), imported when a model is quantized."""
    return (optional.require("qwix"), optional.require("qwix.contrib.gptq_core"),
            optional.require("qwix.contrib.awq_core"))


def how_to(qtype, group_size: int | None, scheme: str, in_axis: int):
    """qwix's description of one matrix's quantization: a scale per output channel, grouped in
    ``group_size`` runs along the input axis ``in_axis``."""
    qarray = optional.require("qwix._src.core.qarray")
    return qarray.HowToQuantize(qtype=qtype, channelwise_axes=(1 - in_axis,),
                         tiled_axes={in_axis: group_size} if group_size else {},
                         calibration_method=scheme)


@functools.partial(jax.jit, static_argnames=("qtype", "group_size", "scheme", "damping"))
def gptq(W: jax.Array, hessian: jax.Array, *, qtype, group_size, scheme, damping=0.01):
    """GPTQ (Frantar et al. 2022) of ``W [Out, In]`` given ``hessian = X^T X [In, In]``: columns
    are rounded in order and each one's error is spread over the columns not yet rounded, through
    the Cholesky factor of the inverse Hessian; a group's scales are found when its first column
    is reached. Returns a qwix ``QArray`` ``[Out, In]`` with scales ``[Out, G]``.

    The same algorithm as qwix's ``gptq_core.quantize_weight`` (its helpers find each group's
    scales and round each column), with the column loop as a ``lax.fori_loop``: qwix unrolls it
    in Python, so its compile time grows with In (170 s for a 2-layer d=64 model here)."""
    qwix, gptq_core, _ = qwix_modules()
    Out, In = W.shape
    g = group_size or In
    G = In // g
    dead = jnp.diag(hessian) == 0
    hessian = jnp.where(dead[None, :] & jnp.eye(In, dtype=bool), 1.0, hessian)
    W = jnp.where(dead[None, :], 0.0, W)  # an input that is always 0 gets weight 0
    hessian = hessian + damping * jnp.mean(jnp.diag(hessian)) * jnp.eye(In)
    Hinv = jnp.linalg.cholesky(gptq_core.cholesky_inverse(jnp.linalg.cholesky(hessian)),
                               upper=True)  # [In, In], upper triangular
    how = how_to(qtype, None, scheme, in_axis=1)
    asymmetric = scheme == "minmax"

    def group(G_i, carry):
        W, Q, S, Z = carry
        block = jax.lax.dynamic_slice_in_dim(W, G_i * g, g, axis=1)  # [Out, g]
        scale, zero = gptq_core.find_params(block, how)  # [Out, 1] each
        S = jax.lax.dynamic_update_slice_in_dim(S, scale, G_i, axis=1)
        if asymmetric:
            Z = jax.lax.dynamic_update_slice_in_dim(Z, zero, G_i, axis=1)

        def column(c, carry):
            W, Q = carry
            i = G_i * g + c
            w = jax.lax.dynamic_slice_in_dim(W, i, 1, axis=1)  # [Out, 1]
            q, dq = gptq_core.quantize(w, qtype, scale, zero if asymmetric else None)
            err = (w - dq) / Hinv[i, i]
            row = jnp.where(jnp.arange(In) > i, Hinv[i], 0.0)  # only columns not yet rounded
            W = jax.lax.dynamic_update_slice_in_dim(W - err * row[None, :], dq, i, axis=1)
            return W, jax.lax.dynamic_update_slice_in_dim(Q, q, i, axis=1)

        W, Q = jax.lax.fori_loop(0, g, column, (W, Q))
        return W, Q, S, Z

    init = (W, jnp.zeros((Out, In), qtype), jnp.zeros((Out, G), W.dtype),
            jnp.zeros((Out, G), qtype))
    _, Q, S, Z = jax.lax.fori_loop(0, G, group, init)
    return qwix.QArray(Q, S, Z if asymmetric else None)


def quantize_matrix(w, qtype, group_size, scheme, method, stat):
    """``w [In, Out]`` -> ``(qvalue [In, Out], scale [G, Out], offset or None, input_scale or
    None)`` through qwix."""
    qwix, _, awq_core = qwix_modules()
    input_scale = None
    if method == "rtn":
        qa = qwix.quantize(jnp.asarray(w, jnp.float32), qtype, channelwise_axes=(1,),
                           tiled_axes={0: group_size} if group_size else None,
                           calibration_method=scheme)
    elif method == "gptq":
        qa = gptq(jnp.asarray(w, jnp.float32).T, stat, qtype=qtype,
                   group_size=group_size, scheme=scheme)
        qa = jax.tree.map(lambda a: a.T, qa)
    else:
        how = how_to(qtype, group_size, scheme, in_axis=1)
        qa, factors = awq_core.quantize_weight(jnp.asarray(w, jnp.float32).T, stat, how)
        qa = jax.tree.map(lambda a: a.T, qa)
        input_scale = 1.0 / factors[0]  # x @ (dq / factors) == (x / factors) @ dq
    offset = None
    if qa.zero_point is not None:
        offset = -qa.scale * qa.zero_point.astype(jnp.float32)
    return qa.qvalue, qa.scale, offset, input_scale
