"""Stand-in models, tokenizers and configs the tests share, so that expected outputs are exact.

Models with the Transformer's call signature over a real cache (``model(tokens, cache=cache,
num_valid=...) -> (logits, cache)``) write each token into the cache as its key and value and read
the history back from there, so any error in the slots or lengths the decoders keep shows in the
output:

- ``NextToken``: the next token is ``(last + 1) % V`` by a margin of 10 logits, ``last`` read back
  from the cache slot the decoder says the token sits at (variants: by position, a skip, NaN);
- ``Uniform``: every next token equally likely (a sample shows its random stream alone);
- ``Chain``: a first- or second-order Markov chain given by its table.

Plain functions ``tokens [B, T] -> logits [B, T, V]`` (``uniform``, ``next_is_last_plus_one``,
``one_in_position_plus_one``) stand in for a model where only logits matter (perplexity, quality).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import decodelab as dl
from decodelab.sampling.constraint import ConstraintTable

# DESIGN.md §5: 2 layers, width 64, vocab 512, sequences <= 64; grouped-query attention
# (4 query heads share 2 kv heads).
TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256,
            max_seq_len=64)


def standin_config(vocab_size: int) -> dl.ModelConfig:
    """The config a stand-in reports: its vocabulary, one layer of one head of width 1 (one cache
    value per token: the token itself)."""
    return dl.ModelConfig(vocab_size=vocab_size, d_model=1, n_layers=1, n_heads=1,
                          position="nope")


def _store(tokens: jax.Array, cache):
    """Write ``tokens [B, T]`` as their own keys and values; the cache and the slots they sit at."""
    positions = cache.positions(tokens.shape[1])  # [B, T]
    stored = tokens.astype(jnp.float32)[:, :, None, None]  # [B, T, K=1, H=1]
    return cache.write(0, stored, stored), positions


def _read(cache, positions: jax.Array) -> jax.Array:
    """``[B, T]`` int: the tokens held at ``positions`` (clipped to the cache)."""
    S = cache.max_len
    held = jnp.round(cache.read(0, 0, S)[0][:, 0, :, 0]).astype(jnp.int32)  # [B, S]
    return jnp.take_along_axis(held, jnp.clip(positions, 0, S - 1), axis=1)


def _valid(tokens: jax.Array, num_valid):
    B, T = tokens.shape
    return jnp.full((B,), T, jnp.int32) if num_valid is None else num_valid


class NextToken(nnx.Module):
    """Next token ``(last + 1) % V`` by a margin of ``margin`` logits over ``base`` (zeros by
    default), ``last`` read back from the cache. ``rule="position"``: ``(position + 1) % V``
    instead, which exposes any error in the per-row lengths. ``skip_after=m``: after a token ``t``
    with ``t % m == m - 1`` the next is ``(t + 2) % V``. A row whose next token would be
    ``nan_token`` gets NaN logits."""

    def __init__(self, vocab_size: int = 32, *, rule: str = "next", margin: float = 10.0,
                 base=None, skip_after: int = 0, nan_token: int = -1):
        self.config = standin_config(vocab_size)
        self.rule, self.margin, self.skip_after, self.nan_token = (rule, margin, skip_after,
                                                                   nan_token)
        self.base = nnx.Param(jnp.zeros((vocab_size,)) if base is None
                              else jnp.asarray(base, jnp.float32))

    def __call__(self, tokens, *, cache, num_valid=None, reach=None):
        V = self.config.vocab_size
        cache, positions = _store(tokens, cache)
        source = positions if self.rule == "position" else _read(cache, positions)  # [B, T]
        step = 1
        if self.skip_after:
            step = jnp.where(source % self.skip_after == self.skip_after - 1, 2, 1)
        nxt = (source + step) % V  # [B, T]
        logits = self.base[...][None, None, :] + self.margin * jax.nn.one_hot(nxt, V)
        logits = jnp.where((nxt == self.nan_token)[:, :, None], jnp.nan, logits)
        return logits, cache.advance(_valid(tokens, num_valid))


def padded_next_token(vocab_size: int, tokenizer_size: int) -> NextToken:
    """``NextToken`` over a vocabulary padded past a tokenizer's ``tokenizer_size`` ids, whose
    padding ids have the largest logits (by 50, over the next token's margin of 10): a decoder
    that does not mask the padding picks padding every step."""
    padding = jnp.arange(vocab_size) >= tokenizer_size
    return NextToken(vocab_size, base=jnp.where(padding, 50.0, 0.0))


# --- Hand-built constraints -----------------------------------------------------------------------


def even_automaton(V: int, eos: int, count: int | None):
    """The dense automaton (``ConstraintTable.from_dense``'s arrays, state 0 free) of "``count``
    even non-EOS ids, then EOS" (``count=None``: one or more): states 1..count each take an even
    id to the next; the last state accepts and takes EOS, or (``None``) more even ids too."""
    Q = 3 if count is None else count + 2
    allowed, nxt = np.zeros((Q, V), bool), np.zeros((Q, V), np.int32)
    accepting = np.zeros((Q,), bool)
    allowed[0], accepting[0], accepting[Q - 1] = True, True, True
    even = (np.arange(V) % 2 == 0) & (np.arange(V) != eos)
    for q in range(1, Q - 1):
        allowed[q], nxt[q] = even, np.where(even, q + 1, 0)
    if count is None:
        allowed[Q - 1], nxt[Q - 1] = even, np.where(even, Q - 1, 0)
    allowed[Q - 1, eos], nxt[Q - 1, eos] = True, Q - 1
    return allowed, nxt, accepting


class HandBuiltAutomata:
    """Stands in for ``sampling.automaton`` (its ``table``): regexes named "even+" and "even{n}"
    (``even_automaton``), stacked after the free state as the real builder stacks its patterns;
    "even{n}!" is even{n} untrimmed, its last state a dead end that allows nothing (the real
    builder trims such states away). ``calls`` counts the tables built."""

    def __init__(self):
        self.calls = 0

    def table(self, constraints, tokenizer, vocab_size, eos_ids):
        self.calls += 1
        parts, starts, offset = [], [], 1
        automata = {}
        for row in constraints:
            if row is None:
                starts.append(0)
                continue
            pattern = row[1]
            if pattern not in automata:
                count = None if pattern == "even+" else int(pattern.strip("!")[len("even{"):-1])
                allowed, nxt, accepting = even_automaton(vocab_size, eos_ids[0], count)
                if pattern.endswith("!"):
                    allowed[-1], accepting[-1] = False, False
                automata[pattern] = offset
                parts.append((allowed[1:], np.where(allowed[1:], nxt[1:] + offset - 1, 0),
                              accepting[1:]))
                offset += len(accepting) - 1
            starts.append(automata[pattern])
        free = (np.ones((1, vocab_size), bool), np.zeros((1, vocab_size), np.int32), [True])
        allowed, nxt, accepting = (np.concatenate([np.asarray(a) for a in arrays])
                                   for arrays in zip(free, *parts))
        return (ConstraintTable.from_dense(allowed, nxt, accepting),
                np.array(starts, np.int32))


class Uniform(nnx.Module):
    """Every next token equally likely, so a sample shows its random stream alone."""

    def __init__(self, vocab_size: int = 512):
        self.config = standin_config(vocab_size)
        self.base = nnx.Param(jnp.zeros((vocab_size,)))

    def __call__(self, tokens, *, cache, num_valid=None, reach=None):
        B, T = tokens.shape
        return (jnp.broadcast_to(self.base[...], (B, T, self.config.vocab_size)),
                cache.advance(_valid(tokens, num_valid)))


class Chain(nnx.Module):
    """A Markov chain: next-token log-probabilities ``log table[t2, t1]`` (second order, ``table
    [V, V, V]``) or ``log table[t1]`` (first order, ``[V, V]``), where ``t1`` and ``t2`` are the
    last two tokens read back from the cache row (a one-token history reads ``t1`` twice), which
    exposes any error in the reordering of cache rows."""

    def __init__(self, table):
        table = np.asarray(table, np.float64)
        if table.ndim == 2:  # first order: the same rows whatever came before
            table = np.broadcast_to(table[None], (table.shape[0],) + table.shape)
        self.config = standin_config(table.shape[-1])
        with np.errstate(divide="ignore"):
            self.logp = nnx.Param(jnp.asarray(np.log(table), jnp.float32))  # [V, V, V]

    def __call__(self, tokens, *, cache, num_valid=None, reach=None):
        cache, positions = _store(tokens, cache)
        t1, t2 = _read(cache, positions), _read(cache, positions - 1)  # [B, T] each
        return self.logp[...][t2, t1], cache.advance(_valid(tokens, num_valid))


# A first-order chain where greedy and beam search disagree (``Chain(DISAGREE)``). After 0: A=1
# (0.5) or B=2 (0.4): log(p1 / p2) = 0.223. After A the best is 6 (0.4), then 4 and 5 (0.3 each):
# log(0.4 / 0.3) = 0.288; after B, C=3 (0.9). Greedy: 0 -> 1 -> 6, probability 0.2; a beam of 2
# keeps B and finds 0 -> 2 -> 3, probability 0.36. The rest of each row is 1e-3 before
# normalising.
DISAGREE = np.full((8, 8), 1e-3)
DISAGREE[0, [1, 2, 4, 5]] = [0.5, 0.4, 0.05, 0.05]
DISAGREE[1, [4, 5, 6]] = [0.3, 0.3, 0.4]
DISAGREE[2, [3, 4]] = [0.9, 0.1]
DISAGREE /= DISAGREE.sum(axis=1, keepdims=True)


def chain_logp(table, history) -> np.ndarray:
    """``[V]``: the log-probability of each next token after ``history`` under ``Chain(table)``."""
    table = np.asarray(table, np.float64)
    if table.ndim == 2:
        return np.log(table[history[-1]])
    t2 = history[-2] if len(history) > 1 else history[-1]
    return np.log(table[t2, history[-1]])


# --- Logits functions -----------------------------------------------------------------------------


def uniform(vocab_size: int):
    """``tokens [B, T] -> logits [B, T, V]``: every token equally likely."""
    return lambda tokens: jnp.zeros(tokens.shape + (vocab_size,), jnp.float32)


def next_is_last_plus_one(vocab_size: int):
    """``tokens -> logits``: certain (by 1e4 logits) that token t is followed by ``(t + 1) % V``."""
    return lambda tokens: 1e4 * nnx.one_hot((tokens + 1) % vocab_size, vocab_size)


def one_in_position_plus_one(vocab_size: int):
    """``tokens -> logits``: at input position j, tokens 0..j equally likely and the rest
    impossible, so target 0 there has NLL ``log(j + 1)``."""

    def logits(tokens):
        positions = jnp.arange(tokens.shape[1])[None, :, None]  # [1, T, 1]
        vocab = jnp.arange(vocab_size)[None, None, :]  # [1, 1, V]
        return jnp.broadcast_to(jnp.where(vocab <= positions, 0.0, -jnp.inf),
                                tokens.shape + (vocab_size,))

    return logits


# --- Tokenizers -----------------------------------------------------------------------------------


class Chars:
    """One id per character, its code point modulo 512 (the tiny vocabulary), so streams and
    prompts can be written out exactly; bos 2 and eos 3 are control characters no text here
    holds."""

    bos_id, eos_id = 2, 3

    def encode(self, text):
        return [ord(c) % 512 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Letters:
    """Ids 0..25 are a..z, 26..31 the two-letter pieces AB, CD, EF, GH, IJ, KL (a stop string may
    end inside a piece)."""

    PIECES = [chr(ord("a") + i) for i in range(26)] + ["AB", "CD", "EF", "GH", "IJ", "KL"]

    def encode(self, text):
        return [self.PIECES.index(c) for c in text if c in self.PIECES]

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)


class Pieces:
    """A tokenizer of ``vocab_size`` ids, id i the letter ``i % 26``; like a real one it refuses
    to decode an id past its vocabulary (a padded model's padding)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {list(ids)}")
        return "".join(chr(ord("a") + i % 26) for i in ids)


class FakeTokenizer:
    """What a checkpoint and the tokenizer checks read of a tokenizer: its serialized model (the
    bytes of ``name``) and its vocabulary size."""

    def __init__(self, name: str = "fake", vocab_size: int | None = None):
        self.name, self.vocab_size = name, vocab_size

    def serialized_model(self):
        return self.name.encode()


class Spelled:
    """A vocabulary given by its spelling: id i stands for ``tokens[i]`` (None: a special id no
    text spells), as a constraint's builder reads a tokenizer (``token_bytes``)."""

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def token_bytes(self):
        return list(self.tokens)
