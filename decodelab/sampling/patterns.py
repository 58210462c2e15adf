"""Structured-output patterns as a caller gives them: ``regex`` and ``json_schema``, each one
value for the batch or one per row, and the batch's ``ConstraintTable`` built from them.

Conventions (``SamplingParams`` and ``BeamOptions`` rely on them):

- A regex is a str; a JSON schema a dict or its JSON text. None (the default) is free text.
  A list or tuple gives one value per row (None where a row is free); any other value is the
  whole batch's. A row may have a regex or a schema, never both.
- Patterns are strings, not numbers: they never enter ``RowParams``. ``pattern_table`` turns a
  batch's patterns into one table and each row's start state, compiling them on the host
  (``sampling.automaton``, imported only when some row has a pattern): with no pattern there is
  no table work at all, and the loops trace no table (their programs are those of unconstrained
  decoding).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.sampling.constraint import ConstraintTable

# A constraint's kind -> what a pattern of it must be, in words and as a test.
KINDS = {"regex": ("a str", lambda p: isinstance(p, str)),
         "json_schema": ("a dict or a JSON str", lambda p: isinstance(p, (str, Mapping)))}


def _is_per_row(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def check_patterns(regex: Any, json_schema: Any) -> None:
    """The ``regex`` and ``json_schema`` of a call: each None, one pattern or one per row (its
    kind's type or None), never both on one row; a ValueError names the field and the row."""
    for kind, value in (("regex", regex), ("json_schema", json_schema)):
        what, ok = KINDS[kind]
        values = value if _is_per_row(value) else [value]
        if _is_per_row(value) and not value:
            raise ValueError(f"{kind} must be {what}, None, or a non-empty list with one per "
                             f"row, got {value!r}")
        for row, pattern in enumerate(values):
            if pattern is not None and not ok(pattern):
                where = f"{kind}[{row}]" if _is_per_row(value) else kind
                raise ValueError(f"{where} must be {what} or None, got {pattern!r}")
    if _is_per_row(regex) and _is_per_row(json_schema) and len(regex) != len(json_schema):
        raise ValueError(f"regex has {len(regex)} values but json_schema has "
                         f"{len(json_schema)}; give one value or one per row for each")
    rows = max(len(v) if _is_per_row(v) else 1 for v in (regex, json_schema))
    for row, (r, s) in enumerate(zip(_rows(regex, rows), _rows(json_schema, rows))):
        if r is not None and s is not None:
            raise ValueError(f"row {row} has both regex={r!r} and json_schema={s!r}; a row "
                             f"takes one constraint (give the other None on that row)")


def _rows(value: Any, batch_size: int) -> list[Any]:
    return list(value) if _is_per_row(value) else [value] * batch_size


def row_patterns(regex: Any, json_schema: Any,
                 batch_size: int) -> list[tuple[str, Any] | None]:
    """One ``(kind, pattern)`` or None per row of a batch of ``batch_size`` rows, from patterns
    checked by ``check_patterns``; a per-row list of another length is a ValueError."""
    for kind, value in (("regex", regex), ("json_schema", json_schema)):
        if _is_per_row(value) and len(value) != batch_size:
            raise ValueError(f"{kind} has {len(value)} values but the batch has {batch_size} "
                             f"rows; give one value or one per row")
    return [("regex", r) if r is not None else ("json_schema", s) if s is not None else None
            for r, s in zip(_rows(regex, batch_size), _rows(json_schema, batch_size))]


def pattern_table(regex: Any, json_schema: Any, batch_size: int, vocab_size: int, tokenizer: Any,
                  eos_ids: Sequence[int]) -> tuple[ConstraintTable, np.ndarray] | None:
    """The batch's constraint table and each row's start state ``[B]`` int32 (``FREE`` for a
    free row), or None when no row has a pattern (nothing is built). Compiling a pattern needs
    the model's ``tokenizer`` and ``eos_ids`` (allowed exactly in accepting states); the builder
    (``sampling.automaton.table``) refuses a bad pattern or a missing tokenizer with a
    ValueError naming the row and the pattern."""
    check_patterns(regex, json_schema)
    rows = row_patterns(regex, json_schema, batch_size)
    if all(row is None for row in rows):
        return None
    # Imported here: it needs the ``structured`` extra, which only a constrained call uses.
    automaton = importlib.import_module("decodelab.sampling.automaton")
    table, starts = automaton.table(rows, tokenizer, vocab_size, list(eos_ids))
    return table, np.asarray(starts, np.int32)
