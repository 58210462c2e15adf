"""A step function run as one compiled ``lax.while_loop``, and its Python-loop twin.

Every decoder (``decode``, ``beam``, ``speculative``) and the serving engine has the same shape:
a pure ``body(operands, state) -> state`` and a ``running(operands, state) -> [] bool``. A
``CompiledLoop`` compiles both into one ``lax.while_loop`` (``<name>_loop``), and compiles the body
alone (``<name>_step``) for the Python twin used for debugging and streaming, which gives
identical states because it runs the same body. ``operands`` are traced (weights, budgets);
keyword arguments named in ``static_argnames`` are static (graph definitions, drafters), so the
programs compile once per static value and state shapes. The state is donated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax


class CompiledLoop:
    """``while running(operands, state): state = body(operands, state, **static)``."""

    def __init__(self, name: str, body: Callable[..., Any], running: Callable[[Any, Any], Any],
                 static_argnames: Sequence[str] = ()):
        self.body, self.running = body, running

        def loop(operands, state, **static):
            return jax.lax.while_loop(lambda s: running(operands, s),
                                      lambda s: body(operands, s, **static), state)

        def step(operands, state, **static):
            return body(operands, state, **static)

        # The names are what a compile counter (jax.monitoring) and a profiler see.
        loop.__name__ = loop.__qualname__ = f"{name}_loop"
        step.__name__ = step.__qualname__ = f"{name}_step"
        jit = functools.partial(jax.jit, static_argnames=tuple(static_argnames),
                                donate_argnames=("state",))
        self.loop, self.step = jit(loop), jit(step)

    def run(self, operands: Any, state: Any, *, python_loop: bool = False, **static: Any) -> Any:
        """The final state: one compiled loop, or (``python_loop``) the compiled body called from
        Python while ``running`` holds."""
        if not python_loop:
            return self.loop(operands, state, **static)
        while bool(self.running(operands, state)):
            state = self.step(operands, state, **static)
        return state
