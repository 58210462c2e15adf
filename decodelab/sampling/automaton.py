"""Constraints compiled on the host: a regex or a JSON schema -> a token-level automaton over the
model's own vocabulary (outlines-core) -> the states of a ``ConstraintTable``.

What a caller may rely on:

- A vocabulary is what a tokenizer spells: any object with ``token_bytes() -> list[bytes |
  None]`` (``TokenSpelling``; ``text.Tokenizer`` and ``convert.PretrainedTokenizer`` have it), one
  entry per id. None marks an id that no text spells (special and control tokens): never allowed
  inside a pattern. Ids from the tokenizer's size up to the model's ``vocab_size`` (a padded
  vocabulary) are never allowed either.
- Patterns are matched over bytes, so a byte-level token that is part of a UTF-8 character, or a
  token that crosses the end of one part of a pattern into the next, is allowed where its bytes
  fit.
- An automaton's states are numbered 0..q-1, 0 its start (outlines-core's ids are not
  contiguous), and trimmed: a state from which no accepting state can be reached is dropped
  with the transitions into it, so a row never reaches a state that allows no token. The
  end-of-sequence ids are allowed exactly in accepting states (taking one keeps the state).
- Compiled automata are cached by (vocabulary digest, kind, pattern), the least recently used
  dropped past ``CACHE_SIZE``: the same pattern on the same vocabulary is the same object.
- ``table`` puts the distinct patterns of a batch after the free state 0, each once, and gives
  every row its start state; the states are padded to a power of two (``from_dense``), so a
  new pattern of similar size reuses the compiled program. The last few tables are cached by
  their patterns (and a tokenizer's spelling by the tokenizer object), so a batch that repeats
  an earlier batch's patterns builds and uploads nothing.

outlines-core (the ``structured`` extra) is imported only when a pattern is compiled.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from decodelab.checks import check_int, check_one_of, check_size, tokenizer_size
from decodelab.optional import require
from decodelab.sampling import constraint
from decodelab.sampling.constraint import FREE, ConstraintTable

CACHE_SIZE = 64  # compiled automata kept


class TokenSpelling(Protocol):
    def token_bytes(self) -> list[bytes | None]:
        """``[N]``: the bytes each id stands for in a decoded text; None for an id no text
        spells."""


@dataclasses.dataclass(frozen=True, eq=False)
class Vocab:
    """A tokenizer's spelling of its ids for a model of ``vocab_size`` ids, checked."""

    tokens: tuple[bytes | None, ...]  # [N], N <= vocab_size: what each id spells
    eos_ids: tuple[int, ...]  # allowed exactly in accepting states
    vocab_size: int  # V, the model's; ids N..V-1 are padding
    digest: str  # identifies the three above in cache keys


@dataclasses.dataclass(frozen=True, eq=False)
class Automaton:
    """A trimmed token-level automaton: states 0..q-1, 0 the start, as transition lists."""

    accepting: np.ndarray  # [q] bool
    source: np.ndarray  # [E] int32: a transition's state
    token: np.ndarray  # [E] int32: the token it takes (end-of-sequence ids included)
    target: np.ndarray  # [E] int32: the state it goes to

    @property
    def num_states(self) -> int:
        return self.accepting.shape[0]


class _Refused(Exception):
    """A pattern that cannot be compiled; the caller names the row and the pattern."""


def _regex_of_regex(pattern: Any) -> str:
    if not isinstance(pattern, str):
        raise _Refused(f"must be a str, got {type(pattern).__name__}")
    return pattern


def _regex_of_schema(schema: Any) -> str:
    """A JSON schema (its JSON text, or a dict as ``json.loads`` gives one) as a regex."""
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as e:
            raise _Refused(f"is not valid JSON ({e})") from None
    elif isinstance(schema, Mapping):
        try:
            schema = json.dumps(schema)  # key order kept: it is the order properties are written
        except (TypeError, ValueError) as e:
            raise _Refused(f"does not serialize as JSON ({e})") from None
    else:
        raise _Refused(f"must be a JSON str or a dict, got {type(schema).__name__}")
    json_schema = require("outlines_core.json_schema")
    try:
        return json_schema.build_regex_from_schema(schema)
    except Exception as e:  # outlines-core's own (ValueError, TypeError, a Rust panic's error)
        raise _Refused(f"is a schema outlines-core cannot compile ({e})") from None


# A constraint's kind -> its pattern as a regex (a registry line adds a kind).
PATTERN_KINDS: dict[str, Callable[[Any], str]] = {"regex": _regex_of_regex,
                                                  "json_schema": _regex_of_schema}


def vocabulary(tokenizer: Any, vocab_size: int, eos_ids: int | Sequence[int],
               where: str = "tokenizer") -> Vocab:
    """``tokenizer``'s spelling for a model of ``vocab_size`` ids (``where`` names what needs
    it in errors). A constraint needs the tokenizer: None, or an object without
    ``token_bytes``, is refused."""
    if tokenizer is None or not callable(getattr(tokenizer, "token_bytes", None)):
        raise ValueError(f"{where} needs the model's tokenizer, an object with token_bytes() "
                         f"(text.Tokenizer, convert.PretrainedTokenizer), got tokenizer="
                         f"{tokenizer!r}; a model whose tokenizer is unknown cannot be "
                         f"constrained")
    vocab_size = check_size("vocab_size", vocab_size, 1)
    eos = (eos_ids,) if isinstance(eos_ids, (int, np.integer)) else tuple(eos_ids)
    # Keyed by the tokenizer object (held in the value, so its id is not reused meanwhile): a
    # batch's call does not spell and hash the whole vocabulary again.
    return _cached(_VOCABULARIES, (id(tokenizer), vocab_size, eos),
                   lambda: (tokenizer, _spelling(tokenizer, vocab_size, eos)), 4)[1]


def _spelling(tokenizer: Any, vocab_size: int, eos: tuple) -> Vocab:
    size = tokenizer_size("tokenizer", tokenizer, vocab_size)
    tokens = tuple(tokenizer.token_bytes())
    if (size is not None and len(tokens) != size) or len(tokens) > vocab_size or not all(
            t is None or isinstance(t, bytes) for t in tokens):
        raise ValueError(f"tokenizer.token_bytes() must give bytes or None for each of the "
                         f"tokenizer's {size} ids (at most vocab_size={vocab_size}), got "
                         f"{len(tokens)} entries")
    if not eos:
        raise ValueError("eos_ids must name at least one end-of-sequence id (the only tokens an "
                         "accepting state allows past the pattern), got none")
    eos = tuple(check_int(f"eos_ids[{i}]", e, 0, len(tokens) - 1) for i, e in enumerate(eos))
    digest = hashlib.sha256(repr((vocab_size, eos, tokens)).encode()).hexdigest()
    return Vocab(tokens, eos, vocab_size, digest)


_OUTLINES_VOCABULARIES: collections.OrderedDict[str, Any] = collections.OrderedDict()
_AUTOMATA: collections.OrderedDict[tuple[str, str, str], Automaton] = collections.OrderedDict()
_VOCABULARIES: collections.OrderedDict[tuple, tuple[Any, Vocab]] = collections.OrderedDict()
_TABLES: collections.OrderedDict[tuple, tuple[ConstraintTable, dict]] = collections.OrderedDict()


def _cached(cache: collections.OrderedDict, key: Any, make: Callable[[], Any],
            size: int) -> Any:
    """``cache[key]``, made by ``make()`` on a miss; least recently used out past ``size``."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    if len(cache) > size:
        cache.popitem(last=False)
    return value


def clear_cache() -> None:
    """Forget every compiled automaton and vocabulary, so that the next build starts cold (a
    study timing a build)."""
    for cache in (_OUTLINES_VOCABULARIES, _AUTOMATA, _VOCABULARIES, _TABLES):
        cache.clear()


def _outlines_vocabulary(vocab: Vocab) -> Any:
    """outlines-core's ``Vocabulary``: each spelled id but the end-of-sequence ones, by bytes."""
    def make():
        by_bytes: dict[bytes, list[int]] = {}
        for i, spelled in enumerate(vocab.tokens):
            if spelled and i not in vocab.eos_ids:
                by_bytes.setdefault(spelled, []).append(i)
        return require("outlines_core").Vocabulary(vocab.eos_ids[0], by_bytes)

    return _cached(_OUTLINES_VOCABULARIES, vocab.digest, make, 4)


def _trimmed(index: Any, eos_ids: tuple[int, ...]) -> Automaton:
    """outlines-core's index without its own end-of-sequence moves, reachable from the start
    and co-reachable from an accepting state, renumbered from 0 (the start), with ``eos_ids``
    allowed in the accepting states."""
    start, final = index.get_initial_state(), set(index.get_final_states())
    moves = [(s, t, d) for s, row in index.get_transitions().items() for t, d in row.items()
             if t != eos_ids[0]]
    forward, backward = collections.defaultdict(set), collections.defaultdict(set)
    for s, _, d in moves:
        forward[s].add(d)
        backward[d].add(s)

    def reach(seeds, edges) -> set:
        seen, todo = set(seeds), list(seeds)
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    kept = reach([start], forward) & reach(final, backward)
    if start not in kept:
        raise _Refused("cannot be completed: no token sequence of this vocabulary matches it "
                       "from the start")
    number = {s: q for q, s in enumerate([start, *sorted(kept - {start})])}
    accepting = np.array([s in final for s in number], bool)
    moves = [(number[s], t, number[d]) for s, t, d in moves if s in kept and d in kept]
    moves += [(q, e, q) for q in np.flatnonzero(accepting) for e in eos_ids]
    source, token, target = np.array(moves, np.int32).reshape(-1, 3).T
    return Automaton(accepting, source, token, target)


def _compile(regex: str, vocab: Vocab) -> Automaton:
    outlines = require("outlines_core")
    try:
        index = outlines.Index(regex, _outlines_vocabulary(vocab))
    except Exception as e:  # outlines-core's own (ValueError, a Rust panic's error)
        if "incompatible" in str(e):
            raise _Refused(f"cannot be spelled with this vocabulary's tokens (outlines-core: "
                           f"{e})") from None
        raise _Refused(f"is not a regex outlines-core compiles ({e})") from None
    return _trimmed(index, vocab.eos_ids)


def automaton(kind: str, pattern: Any, vocab: Vocab, where: str = "pattern") -> Automaton:
    """The trimmed automaton of ``pattern`` (a ``kind`` of ``PATTERN_KINDS``) over ``vocab``,
    from the cache when compiled before; a pattern that cannot be compiled or completed is a
    ValueError naming ``where`` and the pattern."""
    check_one_of(f"{where} kind", kind, tuple(PATTERN_KINDS))
    try:
        regex = PATTERN_KINDS[kind](pattern)
        return _cached(_AUTOMATA, (vocab.digest, kind, regex), lambda: _compile(regex, vocab),
                       CACHE_SIZE)
    except _Refused as e:
        raise ValueError(f"{where} ({kind} {pattern!r}) {e}") from None


def build(kind: str, pattern: Any, tokenizer: TokenSpelling, vocab_size: int,
          eos_ids: int | Sequence[int]) -> Automaton:
    """The automaton of one ``pattern`` (``kind`` "regex" or "json_schema") over the ids of
    ``tokenizer`` for a model of ``vocab_size`` ids, ``eos_ids`` ending it in accepting
    states."""
    return automaton(kind, pattern, vocabulary(tokenizer, vocab_size, eos_ids,
                                               where=f"pattern ({kind} {pattern!r})"))


def _pattern_key(b: int, constraint: Any) -> tuple[str, str] | None:
    """Row ``b``'s ``(kind, pattern)`` as a dict key (a pattern that is no str by its repr):
    rows with equal keys share states."""
    if constraint is None:
        return None
    if not (isinstance(constraint, tuple) and len(constraint) == 2):
        raise ValueError(f"constraints[{b}] must be a (kind, pattern) pair or None, got "
                         f"{constraint!r}")
    kind, pattern = constraint
    check_one_of(f"constraints[{b}] kind", kind, tuple(PATTERN_KINDS))
    return kind, pattern if isinstance(pattern, str) else repr(pattern)


def table(constraints: Sequence[tuple[str, Any] | None], tokenizer: TokenSpelling | None,
          vocab_size: int, eos_ids: int | Sequence[int]) -> tuple[ConstraintTable, np.ndarray]:
    """The constraint table of a batch and each row's start state ``[B]`` int32.
    ``constraints[b]`` is row b's ``(kind, pattern)`` (``PATTERN_KINDS``) or None for free
    text (state ``FREE``); rows with the same pattern share its states. The table is dense or
    sparse, and must fit, as ``constraint.table_bytes`` says."""
    if isinstance(constraints, (str, bytes)) or not isinstance(constraints, Sequence):
        raise ValueError(f"constraints must be a sequence with one (kind, pattern) or None per "
                         f"row, got {constraints!r}")
    keys = [_pattern_key(b, constraint) for b, constraint in enumerate(constraints)]
    rows = {k: b for b, k in reversed(list(enumerate(keys))) if k is not None}  # first row each
    vocab_size = check_size("vocab_size", vocab_size, 1)
    if not rows:
        return ConstraintTable.free(vocab_size), np.full((len(keys),), FREE, np.int32)
    first = min(rows.values())
    vocab = vocabulary(tokenizer, vocab_size, eos_ids, where=f"constraints[{first}] "
                       f"({constraints[first][0]} {constraints[first][1]!r})")
    order = sorted(rows, key=rows.get)  # the distinct patterns, by their first row

    def stack() -> tuple[ConstraintTable, dict]:
        automata = [automaton(*constraints[rows[k]], vocab, where=f"constraints[{rows[k]}]")
                    for k in order]
        offsets = np.cumsum([1, *(a.num_states for a in automata)])  # [P + 1]
        parts = list(zip(offsets, automata))
        source = np.concatenate([o + a.source for o, a in parts])
        token = np.concatenate([a.token for _, a in parts])
        target = np.concatenate([o + a.target for o, a in parts])
        accepting = np.concatenate([[True], *(a.accepting for a in automata)])
        return (ConstraintTable.from_edges(accepting, vocab_size, source, token, target),
                dict(zip(order, offsets.tolist())))

    # A batch with the patterns of an earlier one (in the same order, under the same byte
    # budgets) reuses its device table; four are kept (each at most MAX_TABLE_BYTES).
    budgets = (constraint.MAX_DENSE_BYTES, constraint.MAX_TABLE_BYTES)
    built, start_of = _cached(_TABLES, (vocab.digest, tuple(order), budgets), stack, 4)
    return built, np.array([FREE if k is None else start_of[k] for k in keys], np.int32)
