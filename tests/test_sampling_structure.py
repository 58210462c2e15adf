"""Sampling costs what is enabled: the compiled decode step of a greedy plan is an argmax (no
sort, no other reduction over the vocabulary, no branch), a top-p step sorts only in its
fallback branch, a penalised step updates carried counts instead of recounting the history, the
candidate-capped top-k and top-p keep exactly the full sort's tokens (the fallback included), a
row whose kept set fits in the candidates (top-k, or a top-p nucleus) draws among them from the
same distribution and only a row that does not fit draws over the vocabulary, a plan's outputs
equal those of ``Plan.ANY``, which traces every processor, and a serving engine's step contains
only what its requests enable. The step is read as its jaxpr (``programs.equations``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import programs
import pytest
import scipy.stats
from flax import nnx
from standins import NextToken

import decodelab as dl
from decodelab import sampling
from decodelab.decode import generation as decode
from decodelab.decode.request import OutputSpec, RowInputs
from decodelab.serving import EngineOptions, Request, SlotEngine, engine_programs

B = 3
MAX_LEN = 32


# --- The step's program ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


def initial_state(model, params: dl.SamplingParams, *, top_n=0, with_entropy=False,
                  any_plan=False):
    V = model.config.vocab_size
    row_params = params.per_row(B, V)
    if any_plan:
        row_params = row_params.with_plan(sampling.Plan.ANY)
    block = np.zeros((B, 16), np.int32)
    block[:, :4] = [[5, 17, 300, 2], [9, 9, 9, 9], [40, 41, 42, 43]]
    block %= V
    graphdef, weights = nnx.split(model)
    rows = RowInputs(prompt_lengths=np.asarray([4, 1, 4], np.int32),
                     keys=sampling.batch_keys(0, B), params=row_params,
                     eos_mask=np.zeros((V,), bool), stop_ids=np.zeros((0, 1), np.int32))
    state = decode.prefill(weights, block, rows, graphdef=graphdef, max_len=MAX_LEN,
                           outputs=OutputSpec(8, top_n, with_entropy))
    return graphdef, weights, state


def step_equations(model, params: dl.SamplingParams, **kwargs) -> list[programs.Equation]:
    """The equations of one compiled decode step (``DECODE_LOOP.step``) under ``params``."""
    graphdef, weights, state = initial_state(model, params, **kwargs)
    return programs.equations(decode.DECODE_LOOP.step, weights, state, graphdef=graphdef)


def named(found: list[programs.Equation], primitive: str) -> list[programs.Equation]:
    return [e for e in found if e.primitive == primitive]


def test_a_greedy_step_is_an_argmax_without_a_sort(tiny):
    found = step_equations(tiny, dl.SamplingParams.greedy())
    assert named(found, "sort") == [] and named(found, "top_k") == []
    # The argmax: the max of the scores (f32) and the min of the ids holding it (s32); nothing
    # else reduces a [B, V] array (the NaN check reuses the max).
    assert programs.reductions_over(found, tiny.config.vocab_size) == [
        ("reduce_max", "float32"), ("reduce_min", "int32")]


def test_a_greedy_draw_has_no_branch_and_no_softmax():
    """A greedy step of a stand-in model (a one-hot of its cache: no branch, no exponential and
    no logarithm of its own) runs none either: the draw is an argmax."""
    found = step_equations(NextToken(), dl.SamplingParams.greedy())
    assert {"cond", "exp", "exp2", "log", "log1p", "logistic"}.isdisjoint(
        e.primitive for e in found)


def test_a_top_p_step_sorts_only_in_its_fallback_branch(tiny):
    found = step_equations(tiny, dl.SamplingParams(temperature=0.8, top_p=0.95))
    sorts = named(found, "sort")
    assert sorts  # the fallback is traced in
    # Never outside a branch, and always in a cond's branch 1: lax.cond's branch when the
    # predicate holds, the fallback.
    assert all(any(index == 1 for _, index in e.branches) for e in sorts)
    # The fallback's and the draw's (vocabulary, per row, candidates); no branch per processor.
    assert sorted(len(c.params["branches"]) for c in programs.conds(found)) == [2, 3]


def random_bits(found: list[programs.Equation], where) -> set[tuple[int, ...]]:
    """The shapes of the random bits made by the equations whose enclosing branches satisfy
    ``where``."""
    return {e.output_types[0].shape for e in named(found, "random_bits") if where(e.branches)}


def test_a_top_p_step_draws_over_the_vocabulary_only_when_a_row_does_not_fit(tiny):
    """The draw's cond: branch 0 (no row fits in the candidates) and branch 1 (some do) make
    B x V random bits; branch 2 (every row fits: its nucleus within the candidates) makes B x C
    and no B x V; nothing outside the branches makes either."""
    V, C = tiny.config.vocab_size, sampling.Plan(active=()).candidates
    assert C < V
    found = step_equations(tiny, dl.SamplingParams(temperature=0.8, top_p=0.95))
    (draw,) = [n for n, c in enumerate(programs.conds(found)) if len(c.params["branches"]) == 3]
    vocabulary, per_row, candidates = (random_bits(found, lambda inside, b=b: (draw, b) in inside)
                                       for b in range(3))
    assert (B, V) in vocabulary and (B, C) not in vocabulary
    assert (B, V) in per_row and (B, C) in per_row
    assert (B, C) in candidates and (B, V) not in candidates
    assert random_bits(found, lambda inside: not inside).isdisjoint({(B, V), (B, C)})


def test_a_penalised_step_updates_the_carried_counts_by_one_token_per_row(tiny):
    """Every scatter into a ``[B, V]`` array writes B updates (the sampled tokens), not B x S
    (the counts rebuilt from the history, as ``Plan.ANY`` does)."""
    V = tiny.config.vocab_size
    params = dl.SamplingParams(temperature=0.7, repetition_penalty=1.2, frequency_penalty=0.3)
    for any_plan, updates in ((False, B), (True, B * MAX_LEN)):
        found = step_equations(tiny, params, any_plan=any_plan)
        into_counts = {programs.elements(e.input_types[2]) for e in found
                       if e.primitive.startswith("scatter") and e.input_types[0].shape == (B, V)}
        assert into_counts == {updates}


def engine_step_equations(model, engine) -> list[programs.Equation]:
    """The equations of one round of the engine's step over its current state."""
    graphdef, weights = nnx.split(model)
    operands = (weights, jnp.asarray(1, jnp.int32))
    carry = (jnp.zeros((), jnp.int32), engine.state)
    return programs.equations(engine_programs.ADVANCE.step, operands, carry, graphdef=graphdef)


def test_an_engine_serving_greedy_requests_steps_with_an_argmax(tiny):
    """The engine's plan is what its requests enable: greedy requests give a step with no sort,
    no top-k and no reduction over the vocabulary but the argmax's two, as ``generate``'s greedy
    step. An engine that serves top-p has the candidates' top-k in its step."""
    V = tiny.config.vocab_size
    engine = SlotEngine(tiny, 2, MAX_LEN)
    engine.insert(Request(id=0, prompt=[5, 17, 300], max_new_tokens=4))
    engine.insert(Request(id=1, prompt=[9], max_new_tokens=4, seed=3))
    assert engine.plan.greedy
    found = engine_step_equations(tiny, engine)
    assert named(found, "sort") == [] and named(found, "top_k") == []
    assert programs.reductions_over(found, V) == [("reduce_max", "float32"),
                                                  ("reduce_min", "int32")]
    sampled = SlotEngine(tiny, 2, MAX_LEN, options=EngineOptions(
        serves=[dl.SamplingParams(temperature=0.8, top_p=0.95)]))
    assert named(engine_step_equations(tiny, sampled), "top_k")


# --- Outputs equal those of the plan that traces every processor ----------------------------------


@pytest.mark.parametrize("params", [
    dl.SamplingParams.greedy(),
    dl.SamplingParams(temperature=0.0, repetition_penalty=1.3, banned_tokens=[3, 4]),
    dl.SamplingParams(temperature=[0.8, 0.0, 1.2], top_p=[0.9, 1.0, 0.5], top_k=[0, 5, 40],
                      frequency_penalty=[0.5, 0.0, 0.3], presence_penalty=0.2),
], ids=["greedy", "greedy-penalised", "mixed"])
def test_a_plan_records_exactly_what_the_any_plan_records(tiny, params):
    """Same tokens, log-probabilities, top log-probabilities and entropies, bit for bit: the
    greedy fast path reports what the processed distribution gives, and the penalty counts the
    plan's loop carries are those ``Plan.ANY`` counts from the tokens every step."""
    outputs = []
    for any_plan in (False, True):
        graphdef, weights, state = initial_state(tiny, params, top_n=3, with_entropy=True,
                                                 any_plan=any_plan)
        assert (state.params.plan.active is None) == any_plan
        penalised = "penalty" in " ".join(state.params.plan.active or ())
        assert (state.seen is not None or state.output_counts is not None) == penalised
        final = decode.DECODE_LOOP.run(weights, state, graphdef=graphdef)
        outputs.append(jax.device_get((final.tokens, final.lengths, final.finish, final.logprobs,
                                       final.top_logprobs, final.top_ids, final.entropy)))
    for planned, traced_all in zip(*outputs):
        np.testing.assert_array_equal(planned, traced_all)


# --- Top-k and top-p through a capped candidate set -----------------------------------------------

V = 512
CAP = 16
_process = jax.jit(sampling.process_logits)


def empty_history(rows: int) -> sampling.History:
    zeros = jnp.zeros((rows,), jnp.int32)
    return sampling.History(tokens=jnp.zeros((rows, 1), jnp.int32), prompt_lengths=zeros,
                            lengths=zeros, eos_mask=jnp.zeros((V,), bool))


def kept(params: dl.SamplingParams, logits: np.ndarray, candidates: int) -> np.ndarray:
    """``[B, V]`` bool: the tokens the processed logits keep."""
    rows = logits.shape[0]
    row_params = params.per_row(rows, V, candidates=candidates)
    return np.asarray(_process(jnp.asarray(logits), row_params, empty_history(rows))) > -np.inf


def random_logits(rows: int, seed: int) -> np.ndarray:
    logits = 4.0 * np.random.default_rng(seed).standard_normal((rows, V)).astype(np.float32)
    logits[:, 100:110] = logits[:, 7:8]  # ties with a token inside the candidates
    return logits


@pytest.mark.parametrize("params", [
    dl.SamplingParams(top_p=[0.3, 0.6, 0.2, 1.0]),
    dl.SamplingParams(top_k=[1, 5, CAP, 0]),
    dl.SamplingParams(top_k=[3, 12, 8, 16], top_p=[0.5, 0.7, 0.9, 0.4]),
    dl.SamplingParams(temperature=2.0, top_p=[0.99, 0.5, 0.95, 0.8]),  # 0.99: needs the fallback
    dl.SamplingParams(top_k=[3, 100, 2, 0]),  # 100 > the cap: the fallback
], ids=["top-p", "top-k", "both", "top-p-fallback", "top-k-fallback"])
def test_capped_candidates_keep_exactly_what_the_full_sort_keeps(params):
    logits = random_logits(4, seed=1)
    reference = kept(params, logits, candidates=V)  # candidates >= V: the full sort
    np.testing.assert_array_equal(kept(params, logits, candidates=CAP), reference)


def test_a_nearly_flat_distribution_takes_the_fallback():
    """Logits -i/1000 (token i): the first n tokens hold (1 - r^n) / (1 - r^512) of the mass,
    r = e^-0.001, which reaches 0.5 at n = 223.58, so top_p 0.5 keeps tokens 0..223: 224, more
    than the 16 candidates, so the row falls back to the full sort. The peaked row beside it
    keeps its two tokens of logit 40 (mass 0.5 before the second)."""
    logits = np.zeros((2, V), np.float32)
    logits[0] = -np.arange(V, dtype=np.float32) / 1000
    logits[1, [3, 9]] = 40.0
    params = dl.SamplingParams(top_p=0.5)
    out = kept(params, logits, candidates=CAP)
    np.testing.assert_array_equal(np.flatnonzero(out[0]), np.arange(224))
    np.testing.assert_array_equal(np.flatnonzero(out[1]), [3, 9])
    np.testing.assert_array_equal(out, kept(params, logits, candidates=V))


# --- Drawing among candidates ---------------------------------------------------------------------

_draw = jax.jit(sampling.draw)
_logprobs = jax.jit(sampling.processed_logprobs)


def test_a_draw_among_candidates_is_exactly_the_top_k_distribution():
    """Chi-square at significance 1e-3 over 4000 rows (each its own key): top-k 4 of logits
    log(0.4, 0.3, 0.2, 0.1, then 0.01 spread over the rest) draws among the 16 candidates, with
    probabilities 0.4 / 0.3 / 0.2 / 0.1 renormalised over the four kept (total 1.0 of 1.01)."""
    rows = 4000
    p = np.full(V, 0.01 / (V - 4))
    p[[10, 20, 30, 40]] = [0.4, 0.3, 0.2, 0.1]
    params = dl.SamplingParams(top_k=4)
    logits = np.tile(np.log(p).astype(np.float32), (rows, 1))
    history = empty_history(rows)
    row_params = params.per_row(rows, V, candidates=CAP)
    logprobs = _logprobs(jnp.asarray(logits), row_params, history)
    tokens = np.asarray(_draw(logprobs, row_params, sampling.batch_keys(0, rows)))
    counts = np.bincount(tokens, minlength=V)
    assert counts.sum() == counts[[10, 20, 30, 40]].sum()
    expected = np.array([0.4, 0.3, 0.2, 0.1]) * rows
    assert scipy.stats.chisquare(counts[[10, 20, 30, 40]], expected).pvalue > 1e-3


_sample = jax.jit(sampling.sample_tokens)


def draws(params: dl.SamplingParams, logits: np.ndarray, seed: int):
    """``draw``'s tokens for each row (row r keyed by ``fold_in(key(seed), r)``) and the tokens
    the vocabulary-wide draw (``sample_tokens``) gives with the same keys."""
    rows = logits.shape[0]
    row_params = params.per_row(rows, V, candidates=CAP)
    logprobs = _logprobs(jnp.asarray(logits), row_params, empty_history(rows))
    keys = sampling.batch_keys(seed, rows)
    return np.asarray(_draw(logprobs, row_params, keys)), np.asarray(_sample(logprobs, keys))


def test_a_top_p_draw_among_candidates_is_exactly_the_nucleus_distribution():
    """Chi-square at significance 1e-3 over 4000 rows: top-p 0.8 of the logits above keeps
    tokens 10, 20 and 30 (mass before them 0, 0.4 / 1.01, 0.7 / 1.01 < 0.8; before token 40
    0.9 / 1.01 >= 0.8), with probabilities 0.4 / 0.3 / 0.2 renormalised over 0.9. Three tokens
    fit in the 16 candidates, so the rows draw among those: another stream than the
    vocabulary-wide draw with the same keys (many rows differ), the same distribution."""
    rows = 4000
    p = np.full(V, 0.01 / (V - 4))
    p[[10, 20, 30, 40]] = [0.4, 0.3, 0.2, 0.1]
    logits = np.tile(np.log(p).astype(np.float32), (rows, 1))
    tokens, over_vocabulary = draws(dl.SamplingParams(top_p=0.8), logits, seed=0)
    counts = np.bincount(tokens, minlength=V)
    assert counts.sum() == counts[[10, 20, 30]].sum()
    expected = np.array([0.4, 0.3, 0.2]) / 0.9 * rows
    assert scipy.stats.chisquare(counts[[10, 20, 30]], expected).pvalue > 1e-3
    assert np.mean(tokens != over_vocabulary) > 0.3


def test_a_top_p_row_whose_nucleus_does_not_fit_draws_over_the_vocabulary():
    """The nearly flat row above keeps 224 tokens under top-p 0.5, more than the 16 candidates:
    its draw is the vocabulary-wide draw, token for token, so exact (chi-square at significance
    1e-3 over the 224 kept tokens, 2000 rows)."""
    rows = 2000
    logits = np.tile(-np.arange(V, dtype=np.float32) / 1000, (rows, 1))
    tokens, over_vocabulary = draws(dl.SamplingParams(top_p=0.5), logits, seed=1)
    np.testing.assert_array_equal(tokens, over_vocabulary)
    counts = np.bincount(tokens, minlength=V)
    assert counts[224:].sum() == 0
    q = np.exp(logits[0, :224].astype(np.float64))
    assert scipy.stats.chisquare(counts[:224], q / q.sum() * rows).pvalue > 1e-3


def test_the_draw_rule_is_per_row():
    """A top-k row draws the same token whether its batch-mate also draws among candidates (the
    vocabulary-wide draw skipped) or not (both draws, selected per row)."""
    logits = random_logits(2, seed=3)
    keys = sampling.batch_keys(5, 2)
    history = empty_history(2)
    tokens = []
    for top_k in ([6, 9], [6, 0]):
        row_params = dl.SamplingParams(top_k=top_k).per_row(2, V, candidates=CAP)
        logprobs = _logprobs(jnp.asarray(logits), row_params, history)
        tokens.append(np.asarray(_draw(logprobs, row_params, keys)))
    assert tokens[0][0] == tokens[1][0]


def test_the_top_p_draw_rule_is_per_row():
    """Under top-p 0.5 a peaked row keeps 2 tokens (it fits in the candidates) and the nearly
    flat row 224 (it does not). Each row draws the same token beside the other (both draws run,
    selected per row) as beside a copy of itself (only its own kind of draw runs)."""
    peaked, flat = random_logits(1, seed=4)[0], -np.arange(V, dtype=np.float32) / 1000
    params = dl.SamplingParams(top_p=0.5)
    assert kept(params, peaked[None], CAP).sum() == 2
    mixed, _ = draws(params, np.stack([peaked, flat]), seed=6)
    fitting, _ = draws(params, np.stack([peaked, peaked]), seed=6)
    not_fitting, _ = draws(params, np.stack([flat, flat]), seed=6)
    assert mixed[0] == fitting[0] and mixed[1] == not_fitting[1]
