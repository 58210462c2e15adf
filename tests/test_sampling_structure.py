"""One program for every sampling setting, and sampling costs what is enabled: a sweep over
mixed settings (llama.cpp's DRY, XTC, dynamic temperature and Mirostat v1 / v2 rows among them)
compiles ``generate``'s, ``speculative_generate``'s and the serving engine's programs once each;
every processor is in the step, under a ``cond`` that skips it when no row enables it; greedy
runs by the argmax branch; nothing sorts the vocabulary and a draw takes one uniform per row;
greedy rows beside sampled ones give the greedy-only batch's outputs; the penalty counts carried
in the state are those recounted from the tokens, updated by one token per row and step, and
no-repeat-n-gram and DRY read carried suffixes without gathering the buffer; top-k and top-p
keep exactly the sort-based sets and draw exactly from them. The step is read as its jaxpr
(``programs.equations``) and the loop as its lowered text.
"""

import re

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
from decodelab.measure import compiles
from decodelab.sampling import processors
from decodelab.serving import Request, SlotEngine

B = 3
MAX_LEN = 32
S = dl.SamplingParams

# Greedy, each processor alone, all together, and per-row mixes (two rows).
SETTINGS = [
    S.greedy(), S(), S(temperature=0.7), S(top_k=5), S(top_p=0.9), S(min_p=0.1),
    S(typical_p=0.8), S(epsilon=0.01), S(eta=0.01), S(top_n_sigma=1.0),
    S(repetition_penalty=1.2), S(frequency_penalty=0.5), S(presence_penalty=0.5),
    S(no_repeat_ngram_size=2), S(min_new_tokens=3), S(logit_bias={3: 2.0}), S(banned_tokens=[1, 2]),
    S(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, typical_p=0.95, epsilon=0.001,
      eta=0.001, top_n_sigma=3.0, repetition_penalty=1.1, frequency_penalty=0.2,
      presence_penalty=0.2, no_repeat_ngram_size=3, min_new_tokens=1, logit_bias={5: -1.0},
      banned_tokens=[7]),
    S(temperature=[0.0, 1.0]), S(top_k=[0, 3]), S(temperature=[0.0, 0.5], top_p=[1.0, 0.5]),
    S(temperature=[0.0, 0.9], repetition_penalty=[1.3, 1.0], min_p=[0.0, 0.2]),
    # llama.cpp's samplers (DRY's breakers as token ids: no tokenizer here)
    S(xtc_probability=0.5, xtc_threshold=0.05), S(temperature=0.8, dynatemp_range=0.5),
    S(dry_multiplier=0.8, dry_allowed_length=1, dry_sequence_breakers=[3]),
    S(temperature=[0.0, 0.9], dry_multiplier=[0.8, 0.0], xtc_probability=[0.0, 1.0],
      dynatemp_range=[0.0, 0.3], dry_penalty_last_n=[4, -1], dry_sequence_breakers=[[1], []]),
    # Mirostat v1, v2, and rows of 0 / 1 / 2 beside each other and beside other processors.
    S(mirostat=1), S(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.5),
    S(temperature=[0.0, 0.8], mirostat=[2, 1]),
    S(mirostat=[0, 2], top_k=[5, 0], mirostat_tau=[5.0, 2.0]),
]
# The settings one request can have (one value per field).
PER_REQUEST = [p for p in SETTINGS
               if all(np.ndim(getattr(p, name)) == 0 for name in processors.PARAMETERS)]
# The processors before temperature: what greedy takes the argmax of.
BEFORE_TEMPERATURE = [p.name for p in processors.PROCESSORS].index("temperature")
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def tiny(tiny_config):
    return dl.Transformer(tiny_config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def fresh(tiny_config):
    """A model of a structure no other test compiles for (one layer, 48 positions), so its
    programs' first compile happens here."""
    return dl.Transformer(tiny_config.replace(n_layers=1, max_seq_len=48), rngs=nnx.Rngs(2))


# --- One program for every setting ----------------------------------------------------------------


def test_twenty_mixed_settings_compile_generate_once(fresh):
    assert len(SETTINGS) >= 20
    with compiles.count_compiles() as counts:
        for params in SETTINGS:
            dl.generate(fresh, PROMPTS, params, 7, seed=0)
    assert (counts["prefill"], counts["_decode_loop"]) == (1, 1), counts


def test_twenty_mixed_settings_compile_speculative_generate_once(fresh, tiny_config):
    draft = dl.Transformer(tiny_config.replace(n_layers=1, max_seq_len=48, d_model=32, n_heads=2,
                                               n_kv_heads=1, d_ff=64), rngs=nnx.Rngs(3))
    with compiles.count_compiles() as counts:
        for params in SETTINGS:
            dl.speculative_generate(fresh, draft, PROMPTS, params, 2, 7, seed=0)
    assert counts["_speculative_loop"] == 1, counts
    assert counts["prefill"] == 1 and counts["initial_state"] == 1, counts


def test_an_engine_admitting_any_mix_of_requests_compiles_its_programs_once(fresh):
    """Requests enabling different processors, two at a time (one prefill of two prompts of one
    bucket each time), the pairs mixing a setting with the next: one compile of each program."""
    assert len(PER_REQUEST) >= 15
    engine = SlotEngine(fresh, 2, 40)
    with compiles.count_compiles() as counts:
        for i, params in enumerate(PER_REQUEST):
            mate = PER_REQUEST[(i + 1) % len(PER_REQUEST)]
            engine.run([Request(id=2 * i, prompt=[1, 2, 3], max_new_tokens=5, params=params,
                                seed=i),
                        Request(id=2 * i + 1, prompt=[4, 5], max_new_tokens=4, params=mate,
                                seed=100 + i)])
    programs_run = ("prefill_rows", "_advance_loop", "harvest")
    assert {name: counts[name] for name in programs_run} == dict.fromkeys(programs_run, 1), counts


# --- The step's program ---------------------------------------------------------------------------


def initial_state(model, params: dl.SamplingParams, *, top_n=0, with_entropy=False):
    V = model.config.vocab_size
    block = np.zeros((B, 16), np.int32)
    block[:, :4] = [[5, 17, 300, 2], [9, 9, 9, 9], [40, 41, 42, 43]]
    block %= V
    graphdef, weights = nnx.split(model)
    rows = RowInputs(prompt_lengths=np.asarray([4, 1, 4], np.int32),
                     keys=sampling.batch_keys(0, B), params=params.per_row(B, V),
                     eos_mask=np.zeros((V,), bool), stop_ids=np.zeros((0, 1), np.int32))
    state = decode.prefill(weights, block, rows, dl.KVCache.init(model.config, B, MAX_LEN),
                           graphdef=graphdef, outputs=OutputSpec(8, top_n, with_entropy))
    return graphdef, weights, state


def step_equations(model, params: dl.SamplingParams) -> list[programs.Equation]:
    """The equations of one compiled decode step (``DECODE_LOOP.step``) under ``params``."""
    graphdef, weights, state = initial_state(model, params)
    return programs.equations(decode.DECODE_LOOP.step, weights, state, graphdef=graphdef)


def named(found: list[programs.Equation], primitive: str) -> list[programs.Equation]:
    return [e for e in found if e.primitive == primitive]


def top_conds(found: list[programs.Equation]) -> list[int]:
    """The numbers of the step's top-level conds, the carried common suffixes' extensions (each
    a cond of its own giving one ``[B, S]`` array) aside."""
    return [n for n, c in enumerate(programs.conds(found)) if not c.branches
            and [t.shape for t in c.output_types] != [(B, MAX_LEN)]]


def group(found: list[programs.Equation]) -> int:
    """The number of the cond of the processors before temperature (``sampling.score``, run once
    for both paths): its branch 1 runs them when some row enables one; it gives the ``[B, V]``
    scores and their ``[B]`` max."""
    conds = programs.conds(found)
    (number,) = [n for n in top_conds(found) if len(conds[n].output_types) == 2
                 and conds[n].output_types[0].shape[0] == B
                 and len(conds[n].output_types[0].shape) == 2]
    return number


def choice(found: list[programs.Equation]) -> int:
    """The number of the step's choice between the sampled draw (branch 0) and the argmax
    (branch 1, taken when every running row is greedy)."""
    before = group(found)
    (number,) = [n for n in top_conds(found) if n != before]
    return number


def processor_conds(found: list[programs.Equation]) -> dict[str, int]:
    """The number of each processor's cond, by name: those before temperature under the group's
    branch 1, the others under the sampled branch, met in pipeline order."""
    conds, before_scope, after_scope = programs.conds(found), group(found), choice(found)
    before = [n for n, c in enumerate(conds) if c.branches == ((before_scope, 1),)]
    after = [n for n, c in enumerate(conds) if c.branches == ((after_scope, 0),)]
    return {p.name: n for p, n in zip(processors.PROCESSORS, before + after)}


def test_every_processor_is_in_the_step_once_under_a_cond_that_skips_it(tiny):
    """The processors before temperature (what greedy takes the argmax of) sit once, under the
    group cond's branch 1, before the choice between the draw and the argmax; the others under
    the sampled branch. Each has a cond whose branch 0 (no row enables it) has no equation;
    every search (a while loop) sits in a branch 1. The group's branch 0 (none enabled) and the
    argmax branch hold no processor."""
    found = step_equations(tiny, dl.SamplingParams.greedy())
    conds = programs.conds(found)
    top, before = choice(found), group(found)
    for scope, count in ((((top, 0),), len(processors.PROCESSORS) - BEFORE_TEMPERATURE),
                         (((before, 1),), BEFORE_TEMPERATURE)):
        skips = [c for c in conds if c.branches == scope]
        assert len(skips) == count
        assert all(len(c.params["branches"][0].jaxpr.eqns) == 0 for c in skips)
    assert not [c for c in conds if c.branches[:1] in (((before, 0),), ((top, 1),))]
    skipping = set(processor_conds(found).values())
    assert len(skipping) == len(processors.PROCESSORS)
    for search in named(found, "while"):
        assert any((n, 1) in search.branches for n in skipping), search.branches


def test_the_argmax_branch_reduces_the_vocabulary_for_the_argmax_alone(tiny):
    """When no processor before temperature is on, the greedy path reduces ``[B, V]`` arrays
    only for the argmax (a max and the min of the ids holding it; the NaN check's max of the raw
    logits is that same max), and draws no random numbers: the logit bias's flag is set once,
    when the parameters are made, not every step."""
    found = step_equations(tiny, dl.SamplingParams.greedy())
    top, before = choice(found), group(found)
    plain = [e for e in found if e.branches in ((), ((top, 1),), ((before, 0),))]
    assert programs.reductions_over(plain, tiny.config.vocab_size) == [
        ("reduce_max", "float32"), ("reduce_min", "float32")]
    greedy = [e for e in found if e.branches[:1] == ((top, 1),)]
    assert named(greedy, "random_bits") == []


def test_the_argmax_branch_of_a_stand_in_model_has_no_exponential():
    """A stand-in model (a one-hot of its cache: no exponential or logarithm of its own): its
    greedy branch, processors aside, has no softmax: the argmax needs none."""
    found = step_equations(NextToken(), dl.SamplingParams.greedy())
    top = choice(found)
    greedy = [e for e in found if e.branches == ((top, 1),)]
    assert {"exp", "exp2", "log", "log1p", "logistic"}.isdisjoint(e.primitive for e in greedy)


def test_the_sampled_branch_takes_its_normaliser_from_the_draw(tiny):
    """Processors aside, the sampled branch exponentiates the ``[B, V]`` scores once (for the
    draw, whose block sums also give each row's normaliser) and takes no logarithm over the
    vocabulary: no log-softmax of ``[B, V]`` per step unless the caller records the
    distribution."""
    found = step_equations(tiny, dl.SamplingParams(temperature=1.0))
    top, V = choice(found), tiny.config.vocab_size
    sampled = [e for e in found if e.branches == ((top, 0),)]

    def over_vocabulary(name):
        return [e for e in sampled if e.primitive == name and e.input_types[0].shape[-1] == V]

    assert len(over_vocabulary("exp")) == 1 and over_vocabulary("log") == []


def test_nothing_in_the_step_sorts_and_a_draw_takes_one_uniform_per_row(tiny):
    found = step_equations(tiny, dl.SamplingParams(temperature=0.8, top_k=40, top_p=0.95))
    assert named(found, "sort") == [] and named(found, "top_k") == []
    assert {e.output_types[0].shape for e in named(found, "random_bits")} == {(B,)}


def test_the_decode_loop_is_one_program_without_a_sort(tiny):
    """The lowered loop is the same text for greedy and for every processor on, and it holds no
    sort and no top-k operation (top-k and top-p cut by a search, not a sort)."""
    texts = []
    for params in (SETTINGS[0], SETTINGS[17]):
        graphdef, weights, state = initial_state(tiny, params)
        texts.append(decode.DECODE_LOOP.loop.lower(weights, state, graphdef=graphdef).as_text())
    assert texts[0] == texts[1]
    assert not re.search(r"stablehlo\.sort|chlo\.top_k", texts[0])


def test_a_penalised_step_updates_the_carried_counts_by_one_token_per_row(tiny):
    """Outside the processors, every scatter into a ``[B, V]`` array writes B updates (the
    sampled tokens into the carried counts), never B x S (counts rebuilt from the token buffer);
    inside them only no-repeat-n-gram and DRY scatter the history, each in the branch that runs
    when a row enables it."""
    V = tiny.config.vocab_size
    found = step_equations(tiny, dl.SamplingParams(temperature=0.7, repetition_penalty=1.2,
                                                   frequency_penalty=0.3))
    into_counts = [e for e in found
                   if e.primitive.startswith("scatter") and e.input_types[0].shape == (B, V)]
    assert {programs.elements(e.input_types[2]) for e in into_counts if not e.branches} == {B}
    ngram = {processor_conds(found)[name] for name in ("no_repeat_ngram_size", "dry_multiplier")}
    inside = [e for e in into_counts if e.branches]
    assert inside and all(any((n, 1) in e.branches for n in ngram) for e in inside)


@pytest.mark.parametrize("name, params", [
    ("no_repeat_ngram_size", S(temperature=0.7, no_repeat_ngram_size=3)),
    ("dry_multiplier", S(temperature=0.7, dry_multiplier=0.8, dry_sequence_breakers=[3]))])
def test_no_repeat_ngram_reads_carried_suffixes_and_gathers_nothing_of_the_buffer(tiny, name,
                                                                                 params):
    """With no-repeat-n-gram (or DRY) on, no gather in the step reads the ``[B, S]`` token buffer
    slot by slot, and the processor runs no loop: it compares the common suffixes the state
    carries (extended by one shifted compare per step) and scatters its tokens once."""
    found = step_equations(tiny, params)
    assert not [e for e in named(found, "gather")
                if e.output_types[0].shape == e.input_types[0].shape == (B, MAX_LEN)]
    ngram = processor_conds(found)[name]
    inside = [e for e in found if (ngram, 1) in e.branches]
    assert named(inside, "scatter-max") or named(inside, "scatter_max")
    assert named(inside, "while") == [] and named(inside, "gather") == []


@pytest.mark.parametrize("name, params, absent", [
    ("dry_multiplier", S(temperature=0.7, dry_multiplier=0.8, dry_sequence_breakers=[3]),
     {"pow", "exp", "exp2", "log"}),
    ("xtc_probability", S(temperature=0.7, xtc_probability=0.5), {"pow", "log", "log1p"})])
def test_dry_and_xtc_price_their_cuts_without_a_transcendental_per_token(tiny, name, params,
                                                                        absent):
    """DRY prices each slot's repeat (``[B, S]``) and scatters the penalties: no power of a
    ``[B, V]`` array. XTC's mixture is log p plus a per-row factor: no logarithm of one (its
    softmax's and log-sum-exps' exponentials are what it reads the row with)."""
    found = step_equations(tiny, params)
    cond = processor_conds(found)[name]
    inside = [e for e in found if (cond, 1) in e.branches]
    V = tiny.config.vocab_size
    assert inside and not [e.primitive for e in inside if e.primitive in absent
                           and e.output_types[0].shape[-1:] == (V,)]


# --- What the loop records ------------------------------------------------------------------------


def run_loop(model, params: dl.SamplingParams):
    graphdef, weights, state = initial_state(model, params, top_n=3, with_entropy=True)
    return decode.DECODE_LOOP.run(weights, state, graphdef=graphdef)


def test_greedy_rows_beside_sampled_rows_record_what_a_greedy_batch_records(tiny):
    """Rows 0 and 2 greedy (row 0 with a presence penalty) beside a sampled row 1: their tokens,
    log-probabilities, top log-probabilities and entropies equal, bit for bit, those of the
    batch whose every row is greedy (which takes the argmax branch at every step)."""
    mixed = run_loop(tiny, dl.SamplingParams(temperature=[0.0, 0.9, 0.0], top_p=[1.0, 0.8, 1.0],
                                             presence_penalty=[0.5, 0.0, 0.0]))
    greedy = run_loop(tiny, dl.SamplingParams(temperature=0.0, presence_penalty=[0.5, 0.0, 0.0]))
    rows = np.asarray([0, 2])
    for field in ("tokens", "lengths", "finish", "logprobs", "top_logprobs", "top_ids", "entropy"):
        np.testing.assert_array_equal(np.asarray(getattr(mixed, field))[rows],
                                      np.asarray(getattr(greedy, field))[rows], err_msg=field)
    assert not np.array_equal(np.asarray(mixed.tokens)[1], np.asarray(greedy.tokens)[1])


@pytest.mark.parametrize("params", [
    dl.SamplingParams.greedy(),
    dl.SamplingParams(temperature=0.0, repetition_penalty=1.3, banned_tokens=[3, 4]),
    dl.SamplingParams(temperature=[0.8, 0.0, 1.2], top_p=[0.9, 1.0, 0.5], top_k=[0, 5, 40],
                      frequency_penalty=[0.5, 0.0, 0.3], presence_penalty=0.2),
], ids=["greedy", "greedy-penalised", "mixed"])
def test_the_carried_counts_are_the_counts_of_the_tokens(tiny, params):
    """After the loop, the output counts and seen tokens carried step by step equal those
    recounted from the final token buffer (``RowState.counted``)."""
    final = run_loop(tiny, params)
    recounted = final.counted()
    assert int(final.output_counts.sum()) == int((final.lengths - final.prompt_lengths).sum())
    for name in ("output_counts", "seen"):
        np.testing.assert_array_equal(getattr(final, name), getattr(recounted, name),
                                      err_msg=name)


# --- Top-k and top-p: the sort-based sets, and draws from them ------------------------------------

V = 512
_process = jax.jit(sampling.process_logits)
_logprobs = jax.jit(sampling.processed_logprobs)
_draw = jax.jit(sampling.draw)


def empty_history(rows: int) -> sampling.History:
    zeros = jnp.zeros((rows,), jnp.int32)
    return sampling.History(tokens=jnp.zeros((rows, 1), jnp.int32), prompt_lengths=zeros,
                            lengths=zeros, eos_mask=jnp.zeros((V,), bool))


def kept(params: dl.SamplingParams, logits: np.ndarray) -> np.ndarray:
    """``[B, V]`` bool: the tokens the processed logits keep."""
    rows = logits.shape[0]
    out = _process(jnp.asarray(logits), params.per_row(rows, V), empty_history(rows))
    return np.asarray(out) > -np.inf


def sorted_reference(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """``[V]`` bool by the sort-based definitions: top-k keeps the k largest (a stable sort:
    the lowest ids among ties), then top-p keeps, in that order, each token while the mass
    before it is below p (float64 sums), with every token tied with the last one kept."""
    keep = np.ones(V, bool)
    order = np.argsort(-logits, kind="stable")
    if top_k:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        z = np.where(keep, logits.astype(np.float64), -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-z, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
        last = z[order][before < top_p].min()
        keep &= z >= last
    return keep


def random_logits(rows: int, seed: int) -> np.ndarray:
    logits = 4.0 * np.random.default_rng(seed).standard_normal((rows, V)).astype(np.float32)
    logits[:, 100:110] = logits[:, 7:8]  # ties with a large token
    return logits


@pytest.mark.parametrize("top_k, top_p", [
    ([0, 0, 0, 0], [0.3, 0.6, 0.2, 1.0]),
    ([1, 5, 16, 0], [1.0] * 4),
    ([3, 12, 8, 16], [0.5, 0.7, 0.9, 0.4]),
    ([3, 100, 2, 0], [1.0, 0.99, 0.95, 0.999]),
], ids=["top-p", "top-k", "both", "wide"])
def test_top_k_and_top_p_keep_exactly_what_the_sort_based_definition_keeps(top_k, top_p):
    logits = random_logits(4, seed=1)
    logits[:, 7] = np.sort(logits[0])[-3]  # the tied group: the third largest logit
    got = kept(dl.SamplingParams(top_k=top_k, top_p=top_p), logits)
    for r in range(4):
        np.testing.assert_array_equal(got[r], sorted_reference(logits[r], top_k[r], top_p[r]))


def test_a_nearly_flat_distribution_keeps_its_whole_nucleus():
    """Logits -i/1000 (token i): the first n tokens hold (1 - r^n) / (1 - r^512) of the mass,
    r = e^-0.001, which reaches 0.5 at n = 223.58, so top_p 0.5 keeps tokens 0..223. The peaked
    row beside it keeps its two tokens of logit 40 (mass 0.5 before the second)."""
    logits = np.zeros((2, V), np.float32)
    logits[0] = -np.arange(V, dtype=np.float32) / 1000
    logits[1, [3, 9]] = 40.0
    out = kept(dl.SamplingParams(top_p=0.5), logits)
    np.testing.assert_array_equal(np.flatnonzero(out[0]), np.arange(224))
    np.testing.assert_array_equal(np.flatnonzero(out[1]), [3, 9])


def draws(params: dl.SamplingParams, logits: np.ndarray, seed: int) -> np.ndarray:
    """``draw``'s token for each row, row r keyed by ``fold_in(fold_in(key(seed), r), 0)``."""
    rows = logits.shape[0]
    logprobs = _logprobs(jnp.asarray(logits), params.per_row(rows, V), empty_history(rows))
    keys = sampling.row_keys(sampling.batch_keys(seed, rows), jnp.zeros((rows,), jnp.int32))
    return np.asarray(_draw(logprobs, keys))


def four_tokens(rows: int) -> np.ndarray:
    """Logits log(0.4, 0.3, 0.2, 0.1) at tokens 10, 20, 30, 40, 0.01 spread over the rest."""
    p = np.full(V, 0.01 / (V - 4))
    p[[10, 20, 30, 40]] = [0.4, 0.3, 0.2, 0.1]
    return np.tile(np.log(p).astype(np.float32), (rows, 1))


@pytest.mark.parametrize("params, support, expected", [
    # top-k 4: the four, renormalised over 1.0 of 1.01
    (dl.SamplingParams(top_k=4), [10, 20, 30, 40], [0.4, 0.3, 0.2, 0.1]),
    # top-p 0.8: mass before 10, 20, 30 is 0, 0.4 / 1.01, 0.7 / 1.01 < 0.8; before 40 0.9 / 1.01
    (dl.SamplingParams(top_p=0.8), [10, 20, 30], np.array([0.4, 0.3, 0.2]) / 0.9),
], ids=["top-k", "top-p"])
def test_a_truncated_draw_is_exactly_the_kept_distribution(params, support, expected):
    """Chi-square at significance 1e-3 over 4000 rows, each its own key; no other token."""
    rows = 4000
    counts = np.bincount(draws(params, four_tokens(rows), seed=0), minlength=V)
    assert counts.sum() == counts[support].sum()
    assert scipy.stats.chisquare(counts[support], np.asarray(expected) * rows).pvalue > 1e-3


def test_a_wide_nucleus_draw_is_exactly_its_distribution():
    """The nearly flat row above keeps 224 tokens under top-p 0.5 (chi-square at significance
    1e-3 over them, 2000 rows)."""
    rows = 2000
    logits = np.tile(-np.arange(V, dtype=np.float32) / 1000, (rows, 1))
    counts = np.bincount(draws(dl.SamplingParams(top_p=0.5), logits, seed=1), minlength=V)
    assert counts[224:].sum() == 0
    q = np.exp(logits[0, :224].astype(np.float64))
    assert scipy.stats.chisquare(counts[:224], q / q.sum() * rows).pvalue > 1e-3


@pytest.mark.parametrize("variants, first, mates", [
    ([dl.SamplingParams(top_k=[6, 9]), dl.SamplingParams(top_k=[6, 0])],
     random_logits(1, seed=3)[0], random_logits(3, seed=4)),
    ([dl.SamplingParams(top_p=0.5)], random_logits(1, seed=4)[0],
     np.stack([-np.arange(V, dtype=np.float32) / 1000, random_logits(1, seed=4)[0],
               np.zeros(V, np.float32)])),
], ids=["top-k", "top-p"])
def test_a_draw_does_not_depend_on_the_batch_mate(variants, first, mates):
    """Row 0 draws the same token whatever row 1 holds (a nearly flat row, a copy of row 0, a
    flat row, ...) and whatever row 1's setting is (top-k 9 or none)."""
    tokens = {int(draws(params, np.stack([first, mate]), seed=5)[0])
              for params in variants for mate in mates}
    assert len(tokens) == 1
