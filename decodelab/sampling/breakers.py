"""DRY's sequence breakers: what a caller gives (``SamplingParams.dry_sequence_breakers``) and
the ``[B, V]`` table of breaker tokens the loops read (``RowParams.dry_breakers``).

Conventions (``penalties.Dry`` and ``History``'s carried DRY suffixes rely on them):

- The value is None (llama.cpp's defaults: newline, colon, double quote, asterisk), a list of
  breakers for every row, or a list with one such list per row. A breaker is a non-empty str or
  a token id (an int); ``[]`` is no breaker.
- A str breaker is every token whose text contains it: llama.cpp's rule for its single-token
  breakers (it tokenizes each breaker and compares token texts). The texts are the tokenizer's
  ``token_bytes()`` (decodelab's ``Tokenizer``, a converted GGUF or Hugging Face tokenizer: the
  ``tokenizer`` of ``DecodeOptions``), read once on the host; with no tokenizer a str breaker is
  a ValueError (give token ids instead). Tokens no text spells (BOS, EOS, pad: ``None`` bytes)
  are never breakers, where llama.cpp compares their rendered names. llama.cpp also matches a
  breaker spelled over several tokens (a token that ends with the breaker's start, then the
  tokens of its rest); decodelab does not: for one-character breakers (the defaults) the two are
  the same. llama.cpp cuts a breaker at 40 characters; so does decodelab.
- Only rows with DRY on get their breakers; every other row's table row is all False, so a call
  without DRY reads no tokenizer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from decodelab.checks import is_int

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")
MAX_CHARS = 40  # llama.cpp's cut


def _is_breaker(b: Any) -> bool:
    return (isinstance(b, str) and len(b) > 0) or is_int(b)


def _is_list(value: Any) -> bool:
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def _per_row(value: Any) -> bool:
    return _is_list(value) and len(value) > 0 and all(_is_list(v) for v in value)


def check_breakers(value: Any) -> None:
    """A ValueError naming ``dry_sequence_breakers`` unless ``value`` is None, a list of
    breakers or a list with one list per row (module docstring)."""
    if value is None:
        return
    rows = value if _per_row(value) else [value]
    for row, breakers in enumerate(rows):
        where = f"dry_sequence_breakers[{row}]" if _per_row(value) else "dry_sequence_breakers"
        if not _is_list(breakers) or not all(_is_breaker(b) for b in breakers):
            raise ValueError(f"{where} must be a list of non-empty strings or token ids, or a "
                             f"list with one such list per row, got {breakers!r}")


@functools.lru_cache(maxsize=8)
def _texts(tokenizer: Any) -> tuple[bytes | None, ...]:
    return tuple(tokenizer.token_bytes())


def _row_table(breakers: Sequence[Any], V: int, tokenizer: Any, where: str) -> np.ndarray:
    table = np.zeros((V,), bool)
    strings = [b[:MAX_CHARS].encode("utf-8") for b in breakers if isinstance(b, str)]
    for b in breakers:
        if is_int(b):
            if not 0 <= int(b) < V:
                raise ValueError(f"{where} token ids must be in [0, {V}), got {b}")
            table[int(b)] = True
    if strings:
        if tokenizer is None or not callable(getattr(tokenizer, "token_bytes", None)):
            raise ValueError(f"{where} has strings {[s.decode() for s in strings]!r}: finding "
                             f"their tokens needs the model's tokenizer (an object with "
                             f"token_bytes(), given as DecodeOptions.tokenizer), got "
                             f"tokenizer={tokenizer!r}; or give token ids, or [] for none")
        for token, text in enumerate(_texts(tokenizer)[:V]):
            if text is not None and any(s in text for s in strings):
                table[token] = True
    return table


def breaker_table(value: Any, batch_size: int, vocab_size: int, tokenizer: Any,
                  on: np.ndarray) -> np.ndarray:
    """``[B, V]`` bool: row b's breaker tokens where ``on[b]`` (DRY is on), else all False."""
    B, V = batch_size, vocab_size
    per_row = _per_row(value)
    if per_row and len(value) != B:
        raise ValueError(f"dry_sequence_breakers has {len(value)} lists but the batch has {B} "
                         f"rows; give one list or one per row")
    table, done = np.zeros((B, V), bool), {}
    for row in np.flatnonzero(on):
        breakers = (value[row] if per_row else DEFAULT_BREAKERS if value is None else value)
        key = tuple((type(b).__name__, str(b)) for b in breakers)
        if key not in done:  # rows that share their breakers share the work
            where = f"dry_sequence_breakers[{row}]" if per_row else "dry_sequence_breakers"
            done[key] = _row_table(breakers, V, tokenizer, where)
        table[row] = done[key]
    return table
