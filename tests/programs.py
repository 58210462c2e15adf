"""Reading a program's structure from its jaxpr and from what ``jax.stages`` reports about its
compiled form, instead of from compiled HLO text (which changes across XLA versions and backends).

- ``equations(fn, *args, **static)``: every equation of ``fn``'s jaxpr, those of its sub-jaxprs
  (jit, while, scan, cond branches, custom derivatives) included, each with the cond branches it
  sits in; ``primitives`` counts their names.
- ``compiled_memory(fn, *args, **static)``: the compiled program's memory statistics (argument,
  output, aliased and temporary bytes).

``static`` keyword arguments are passed through to ``fn`` as Python values: a jitted function with
``static_argnames`` (``graphdef=``, ``drafter=``) gets them as it would in a call.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.extend import core

# Primitives that reduce along an axis (the cumulative ones are reduce-windows in HLO).
REDUCTIONS = ("reduce_max", "reduce_min", "reduce_sum", "reduce_prod", "reduce_and", "reduce_or",
              "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
              "cumlogsumexp")


@dataclasses.dataclass(frozen=True)
class Equation:
    """One equation of a jaxpr: its primitive, its parameters, its operands and results, the cond
    branches it sits in, outermost first: ``(cond, branch index)``, ``cond`` the cond equation's
    number in the order ``equations`` met it; and whether it ``calls`` sub-jaxprs (jit, while,
    cond, ...), whose own equations ``equations`` lists after it: what it makes, they make."""

    primitive: str
    params: dict[str, Any]
    inputs: tuple[Any, ...]  # the operand variables (or literals)
    outputs: tuple[Any, ...]
    branches: tuple[tuple[int, int], ...]
    calls: bool

    @property
    def input_types(self) -> list[jax.core.ShapedArray]:
        return [v.aval for v in self.inputs]

    @property
    def output_types(self) -> list[jax.core.ShapedArray]:
        return [v.aval for v in self.outputs]


def _sub_jaxprs(value: Any) -> Iterator[core.Jaxpr]:
    if isinstance(value, core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def _walk(jaxpr: core.Jaxpr, branches: tuple, conds: list) -> Iterator[Equation]:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = [sub for value in eqn.params.values() for sub in _sub_jaxprs(value)]
        yield Equation(name, dict(eqn.params), tuple(eqn.invars), tuple(eqn.outvars), branches,
                       bool(subs))
        if name == "cond":
            number = len(conds)
            conds.append(eqn)
            for index, branch in enumerate(eqn.params["branches"]):
                yield from _walk(branch.jaxpr, branches + ((number, index),), conds)
            continue
        for sub in subs:
            yield from _walk(sub, branches, conds)


def equations(fn: Callable[..., Any], *args: Any, **static: Any) -> list[Equation]:
    """Every equation of ``fn(*args, **static)``'s jaxpr, sub-jaxprs included (module docstring)."""
    closed = jax.make_jaxpr(functools.partial(fn, **static))(*args)
    return list(_walk(closed.jaxpr, (), []))


def primitives(fn: Callable[..., Any], *args: Any, **static: Any) -> collections.Counter:
    """How often each primitive occurs in ``fn``'s jaxpr, sub-jaxprs included."""
    return collections.Counter(e.primitive for e in equations(fn, *args, **static))


def conds(found: list[Equation]) -> list[Equation]:
    """The cond equations, numbered as ``Equation.branches`` numbers them."""
    return [e for e in found if e.primitive == "cond"]


def reductions_over(found: list[Equation], size: int) -> list[tuple[str, str]]:
    """``(primitive, operand dtype)`` of each distinct reduction that reduces an axis of ``size``
    elements; two equations reducing the same operand the same way count once (the compiler
    computes them once)."""
    distinct = {}
    for e in found:
        if e.primitive not in REDUCTIONS:
            continue
        operand = e.inputs[0]
        axes = e.params.get("axes", (e.params.get("axis"),))
        if any(operand.aval.shape[a] == size for a in axes if a is not None):
            key = (e.primitive, id(operand), tuple(sorted(map(str, e.params.items()))))
            distinct[key] = (e.primitive, str(operand.aval.dtype))
    return sorted(distinct.values())


def elements(aval: jax.core.ShapedArray) -> int:
    return math.prod(aval.shape)


def compiled_memory(fn: Callable[..., Any], *args: Any, **static: Any):
    """The memory statistics of ``fn`` compiled for ``args`` (``jax.stages.Compiled
    .memory_analysis()``): ``argument_size_in_bytes``, ``output_size_in_bytes``,
    ``alias_size_in_bytes`` (arguments whose buffers the outputs reuse: donated and updated in
    place) and ``temp_size_in_bytes`` (every intermediate buffer). ``fn`` may be jitted already."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args, **static).compile().memory_analysis()
