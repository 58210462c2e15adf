"""Per-request constraints in the slot engine: one ``ConstraintTable`` for the patterns of the
requests its slots hold, in the engine's state, and each slot's automaton state beside its
length (``RowState.constraint_states``).

Conventions (the engine relies on them):

- An engine that never admits a constrained request has no table: its programs are those of
  unconstrained decoding. The first constrained request adds one; from then on a step masks
  every running slot's logits with its state (``FREE`` for a free request).
- The table is rebuilt on the host only when a request brings a pattern it lacks, from the
  patterns of the slots occupied then (a retired request's pattern is dropped at the next
  rebuild). The builder stacks each pattern's states in one block, so a slot's state moves
  with its block's start: the running slots' states are shifted on the device, with no read
  back. The states are padded to a power of two, so a new pattern of similar size compiles
  nothing.
- A request's start state goes into its slot with its prompt (``slot_prefill``); a preempted
  request resumes from the state after the tokens it had generated, walked at its ``insert``
  (the one read of the device outside ``step``, and only for such a request).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from decodelab.decode.generation import DecodeState
from decodelab.sampling.constraint import FREE
from decodelab.sampling.patterns import pattern_table, row_patterns
from decodelab.serving.options import EngineOptions
from decodelab.serving.requests import Request


class SlotConstraints:
    """The host's record of which pattern each of ``rows`` slots holds and where its states
    start in the engine's table."""

    def __init__(self, rows: int, vocab_size: int, options: EngineOptions):
        self.vocab_size, self.tokenizer, self.eos_ids = (vocab_size, options.tokenizer,
                                                         options.eos_ids)
        self.patterns: list[tuple[str, Any] | None] = [None] * rows
        self.starts = np.zeros((rows,), np.int32)  # each slot's pattern's start in the table

    def check(self, request: Request) -> str | None:
        """Why ``request``'s pattern cannot be served (the builder's error), or None."""
        params = request.params
        if not params.constrained:
            return None
        try:
            pattern_table(params.regex, params.json_schema, 1, self.vocab_size, self.tokenizer,
                          self.eos_ids)
        except ValueError as error:
            return f"params: {error}"
        return None

    def admit(self, state: DecodeState, slot: int, request: Request,
              generated: list[int]) -> tuple[DecodeState, int]:
        """Record ``request`` (checked) in ``slot``; returns the state, with a rebuilt table if
        its pattern is new, and the slot's start state, after ``generated`` (a resumed
        request's tokens so far)."""
        pattern = row_patterns(request.params.regex, request.params.json_schema, 1)[0]
        self.patterns[slot] = pattern
        if pattern is None:
            return state, FREE
        sharing = [k for k, p in enumerate(self.patterns) if p == pattern and k != slot]
        if sharing:  # its states are in the table already
            self.starts[slot] = self.starts[sharing[0]]
        else:
            state = self._rebuilt(state)
        if not generated:
            return state, int(self.starts[slot])
        start = jnp.asarray([self.starts[slot]], jnp.int32)
        for token in generated:  # the state's own table: the engine's programs donate it
            start = state.constraint.advance(start, jnp.asarray([token], jnp.int32))
        return state, int(start[0])

    def release(self, slot: int) -> None:
        self.patterns[slot] = None

    def _rebuilt(self, state: DecodeState) -> DecodeState:
        """The state with a table of the occupied slots' patterns and the running slots'
        states moved with their patterns' new starts."""
        kinds = [p and p[0] for p in self.patterns]
        values = [p and p[1] for p in self.patterns]
        regex = [v if k == "regex" else None for k, v in zip(kinds, values)]
        schema = [v if k == "json_schema" else None for k, v in zip(kinds, values)]
        table, starts = pattern_table(regex, schema, len(self.patterns), self.vocab_size,
                                      self.tokenizer, self.eos_ids)
        held = np.asarray([p is not None for p in self.patterns])
        shift = np.where(held, starts - self.starts, 0).astype(np.int32)
        old = (state.constraint_states if state.constraint_states is not None
               else jnp.zeros(held.shape, jnp.int32))
        self.starts = np.where(held, starts, 0).astype(np.int32)
        return state.replace(constraint=table,
                             constraint_states=jnp.where(held, old + shift, FREE))
