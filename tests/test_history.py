"""The history the processors read is carried, not recounted: what ``sampling.History`` counts
once, extends by kept tokens and reads at several positions (speculative verification) equals a
recount of the token buffer, no-repeat-n-gram bans exactly what the rescan of the buffer it
replaced banned, and ``generate``, ``speculative_generate`` and the serving engine give the
tokens and log-probabilities of the loops that recounted the history every step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from standins import Chain

import decodelab as dl
from decodelab import sampling
from decodelab.sampling.base import remove
from decodelab.sampling.penalties import NoRepeatNgram
from decodelab.serving import Request, SlotEngine

B, S, V, T = 12, 24, 6, 5


def rescanned_no_repeat_ngram(logits, params, history):
    """The definition carried suffixes replace: up to n gathers of the whole ``[B, S]`` buffer,
    every step."""
    B, S = history.tokens.shape
    n = params.no_repeat_ngram_size[:, None]  # [B, 1]
    length = history.lengths[:, None]  # [B, 1]
    slot = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[None, :], (B, S))
    candidate = (slot >= n - 1) & (slot < length)

    def match_offset(k, candidate):
        before = jnp.take_along_axis(history.tokens, jnp.maximum(slot - k, 0), axis=1)
        last = jnp.take_along_axis(history.tokens, jnp.maximum(length - k, 0), axis=1)
        return candidate & ((k >= n) | (before == last))

    candidate = jax.lax.fori_loop(1, jnp.minimum(jnp.max(n), S), match_offset, candidate)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
    banned = jnp.zeros(logits.shape, jnp.int32).at[rows, history.tokens].max(
        candidate.astype(jnp.int32), mode="drop")
    return remove(logits, banned == 0)


class Rescanned(NoRepeatNgram):
    """No-repeat-n-gram by the rescan (per-row switch and all, as ``NoRepeatNgram``)."""

    def apply(self, logits, params, history):
        return rescanned_no_repeat_ngram(logits, params, history)


def random_rows(seed: int):
    """Rows over 3 of the 6 tokens (n-grams repeat everywhere), of different prompt and total
    lengths, random tokens in the padding past them, no-repeat sizes 0..5 mixed, DRY on in 8
    rows (token 2 a breaker in 4 of them), a length of at most ``S - T`` (room for a block of
    ``T``); and ``[B, T]`` counts to keep of it."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 3, (B, S)).astype(np.int32)
    lengths = rng.integers(1, S - T + 1, B).astype(np.int32)
    prompt_lengths = rng.integers(1, lengths + 1).astype(np.int32)
    sizes = rng.permutation(np.arange(B) % 6)
    history = sampling.History(tokens=jnp.asarray(tokens), prompt_lengths=prompt_lengths,
                               lengths=lengths, eos_mask=jnp.zeros((V,), bool))
    dry = np.arange(B) % 3 != 0
    params = dl.SamplingParams(
        no_repeat_ngram_size=sizes.tolist(), dry_multiplier=np.where(dry, 0.8, 0.0).tolist(),
        dry_sequence_breakers=[[2] if b % 2 else [] for b in range(B)]).per_row(B, V)
    return history, params, rng.integers(0, T + 1, B).astype(np.int32)


def block_of(history) -> jax.Array:
    """``[B, T]``: the tokens the buffer holds from each row's length."""
    at = history.lengths[:, None] + jnp.arange(T)[None, :]
    return jnp.take_along_axis(history.tokens, at, axis=1)


def bans(process, params, history) -> np.ndarray:
    rows = history.lengths.shape[0]
    return np.isneginf(np.asarray(process(jnp.zeros((rows, V)), params, history)))


@pytest.mark.parametrize("seed", range(4))
def test_no_repeat_ngram_bans_what_the_rescan_banned(seed):
    """Counted from the buffer, after a carried extension by a block, and at each position
    along a block (``History.along``): the banned sets of the rescan at the same lengths."""
    history, params, count = random_rows(seed)
    ngram, sizes = NoRepeatNgram(), params.no_repeat_ngram_size
    assert bans(ngram, params, history).any() and (sizes == 0).any()
    np.testing.assert_array_equal(bans(ngram, params, history),
                                  bans(Rescanned(), params, history))

    extended = history.carried(params).extended(block_of(history), count, params)
    later = history.replace(lengths=history.lengths + count)
    np.testing.assert_array_equal(bans(ngram, params, extended),
                                  bans(Rescanned(), params, later))

    along = history.carried(params).along(block_of(history))
    per_position = jax.tree.map(lambda a: jnp.repeat(a, T, axis=0), params)
    recounted = along.replace(output_counts=None, seen=None, ngram_suffixes=None,
                              dry_suffixes=None, ahead=None)
    np.testing.assert_array_equal(bans(ngram, per_position, along),
                                  bans(Rescanned(), per_position, recounted))


@pytest.mark.parametrize("seed", range(2))
def test_carried_counts_extended_and_along_a_block_equal_a_recount(seed):
    """Output counts and seen tokens, carried and then extended by a block, or read at each
    position along it, equal those counted from the buffer at the same lengths; so do the
    common suffixes, slot by slot below each row's length."""
    history, params, count = random_rows(seed)
    carried = history.carried(params)
    extended = carried.extended(block_of(history), count, params)
    along = carried.along(block_of(history))
    per_position = jax.tree.map(lambda a: jnp.repeat(a, T, axis=0), params)
    for got, lengths, rows in ((extended, history.lengths + count, params),
                               (along, along.lengths, per_position)):
        plain = got.replace(output_counts=None, seen=None, ngram_suffixes=None,
                            dry_suffixes=None, ahead=None,
                            lengths=lengths)
        np.testing.assert_array_equal(got.output_occurrences(V), plain.output_occurrences(V))
        np.testing.assert_array_equal(got.seen_tokens(V), plain.seen_tokens(V))
        below = np.arange(S)[None, :] < np.asarray(lengths)[:, None]
        for name in ("ngram_suffixes", "dry_suffixes"):
            np.testing.assert_array_equal(np.where(below, got.suffixes(rows, name), 0),
                                          np.where(below, plain.suffixes(rows, name), 0))


# --- The loops: the tokens and log-probabilities of recounting every step -------------------------


class Recounting(Chain):
    """The same chain under a class of its own, so that its programs are traced apart: with the
    history recounted from the buffer every step (``recounting``)."""


@pytest.fixture
def recounting(monkeypatch):
    """The history as the loops read it before it was carried: counts from the buffer and the
    n-gram rescan, whatever the state carries."""
    monkeypatch.setattr(sampling.History, "output_occurrences",
                        lambda self, V: self.counts(V, output_only=True))
    monkeypatch.setattr(sampling.History, "seen_tokens",
                        lambda self, V: self.counts(V, output_only=False) > 0)
    monkeypatch.setattr(NoRepeatNgram, "apply",
                        lambda self, *args: rescanned_no_repeat_ngram(*args))


CHAIN_V = 24
PROMPTS = [[1, 2, 1, 2, 1], [3], [4, 4, 4, 5, 4, 4], [6, 7, 8, 6, 7]]
PENALTIES = dict(repetition_penalty=[1.3, 1.0, 1.5, 2.0], frequency_penalty=[0.0, 0.5, 0.0, 0.3],
                 presence_penalty=[0.2, 0.0, 0.0, 0.4])
SETTINGS = {"greedy": dl.SamplingParams(temperature=0.0, no_repeat_ngram_size=[0, 1, 2, 3],
                                        **PENALTIES),
            "sampled": dl.SamplingParams(temperature=[0.9, 1.0, 0.0, 1.2],
                                         no_repeat_ngram_size=[2, 0, 3, 4], **PENALTIES)}


def outputs(chain_class) -> dict[str, np.ndarray]:
    """Tokens and log-probabilities of every loop that reads the history, under each setting:
    ``generate``, ``speculative_generate`` (a model drafter: its draft steps read the history
    too; a model-free drafter's rounds read it as this one's do) and the serving engine."""
    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.full(CHAIN_V, 0.3), size=(CHAIN_V, CHAIN_V))
    target = chain_class(table)
    draft = chain_class(0.5 * table + 0.5 * rng.dirichlet(np.full(CHAIN_V, 0.3),
                                                          size=(CHAIN_V, CHAIN_V)))
    found = {}
    for name, params in SETTINGS.items():
        runs = {"generate": dl.generate(target, PROMPTS, params, 12, seed=1),
                "speculative": dl.speculative_generate(target, draft, PROMPTS, params, 3, 12,
                                                       seed=1)}
        for run, out in runs.items():
            found[f"{run} {name} tokens"] = np.asarray(out.tokens)
            found[f"{run} {name} logprobs"] = np.asarray(out.logprobs)
        fields = ("temperature", "no_repeat_ngram_size", *PENALTIES)
        one = [dl.SamplingParams(**{f: np.broadcast_to(getattr(params, f), len(PROMPTS))[i].item()
                                    for f in fields}) for i in range(len(PROMPTS))]
        done = SlotEngine(target, 2, 32).run(
            [Request(id=i, prompt=p, max_new_tokens=12, params=one[i], seed=i)
             for i, p in enumerate(PROMPTS)])
        for i in range(len(PROMPTS)):
            found[f"engine {name} {i} tokens"] = np.asarray(done[i].tokens)
            found[f"engine {name} {i} logprobs"] = np.asarray(done[i].logprobs)
    return found


@pytest.fixture(scope="module")
def carried_outputs():
    return outputs(Chain)


@pytest.mark.slow
def test_every_loop_gives_the_outputs_of_recounting_the_history(carried_outputs, recounting):
    """Greedy and sampled (fixed seeds), with every history processor on in some row and
    no-repeat sizes 0 to 4: bit for bit the tokens and log-probabilities of the loops that
    recounted the history (and rescanned it for n-grams) every step."""
    expected = outputs(Recounting)
    assert expected.keys() == carried_outputs.keys()
    assert any(np.any(expected[k] != expected[k.replace("sampled", "greedy")])
               for k in expected if "sampled" in k)
    for key, value in expected.items():
        np.testing.assert_array_equal(carried_outputs[key], value, err_msg=key)
