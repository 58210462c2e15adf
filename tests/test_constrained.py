"""Constrained decoding in the loops (issue 33): the mask before every processor, each row's
automaton state, EOS only where the pattern is complete, "incomplete" at the budget, and one
program per table bucket.

The tables are hand-built (``standins.HandBuiltAutomata`` stands in for the host-side builder,
``sampling.automaton``): "even{n}" is n even ids then EOS, "even+" one or more. On the stand-in
``NextToken`` (next token ``last + 1`` by 10 logits) the expected outputs are exact: where the
model's favourite is odd, the mask leaves only tied even ids, of which greedy takes the lowest.
"""

import numpy as np
import pytest
from standins import NextToken

import decodelab as dl
from decodelab import serving
from decodelab.measure import compiles

V, EOS = 32, 31
GREEDY = dl.SamplingParams.greedy()


pytestmark = pytest.mark.usefixtures("automata")


@pytest.fixture(scope="module")
def stand_in():
    return NextToken(V)


def run(model, prompts, n, params=GREEDY, seed=0, **options):
    return dl.generate(model, prompts, params, n, seed,
                       options=dl.DecodeOptions(eos_ids=[EOS], **options))


# --- generate -------------------------------------------------------------------------------------


def test_the_mask_the_state_and_eos_only_where_the_pattern_is_complete(stand_in):
    """From 3 the model wants 4 (even: kept), then 5 (odd: masked, so the lowest tied even id,
    0), ...; after four even ids only EOS is allowed, and the row ends "eos"."""
    out = run(stand_in, [[3]], 8, GREEDY.replace(regex="even{4}"))
    assert out.token_lists() == [[4, 0, 0, 0, EOS]] and out.finish_reason == ["eos"]
    np.testing.assert_array_equal(out.logprobs[0, :5], 0.0)  # greedy: one-token distributions


def test_a_row_out_of_budget_before_its_pattern_completes_is_incomplete(stand_in):
    out = run(stand_in, [[3], [3]], 3, GREEDY.replace(regex=["even{4}", "even+"]))
    assert out.token_lists() == [[4, 0, 0], [4, 0, 0]]
    assert out.finish_reason == ["incomplete", "length"]  # even+ accepts after one even id


def test_logprobs_and_top_k_are_those_of_the_constrained_distribution(stand_in):
    """From 5 the model wants 6 (allowed, logit 10) over 15 other allowed even ids (logit 0):
    p(6) = e^10 / (e^10 + 15) renormalised over the allowed ids, never over all 32. Then 7 is
    masked and the 16 even ids tie: top_k=2 keeps the two lowest (0 and 2), each 1/2; applied
    after the mask, not before (top-k of the raw logits would keep only the masked 7)."""
    params = dl.SamplingParams(temperature=1.0, top_k=[0, 2], regex="even+")
    out = run(stand_in, [[5], [4]], 2, params, return_top_logprobs=3)
    expected = 10.0 - np.log(np.exp(10.0) + 15.0)
    np.testing.assert_allclose(out.logprobs[0, 0], expected, rtol=0, atol=1e-5)
    assert out.tokens[1, 0] in (0, 2)
    np.testing.assert_allclose(out.logprobs[1], np.log(0.5), rtol=0, atol=1e-6)
    np.testing.assert_allclose(out.top_logprobs[1, :, :2], np.log(0.5), rtol=0, atol=1e-6)
    assert np.isneginf(out.top_logprobs[1, :, 2]).all()
    assert (out.top_ids[0, 0] % 2 == 0).all()  # the top ids are allowed ones: even


def test_mixed_constrained_and_free_rows_match_each_row_run_alone():
    """Sampled rows (margin 1, so the draw matters) with per-request seeds: two patterns, a
    free row and a greedy constrained row in one batch give each row's tokens and logprobs of
    the row run alone."""
    model = NextToken(V, margin=1.0)
    prompts, seeds = [[3], [8], [5], [20]], [11, 12, 13, 14]
    params = dl.SamplingParams(temperature=[1.0, 1.0, 0.7, 0.0],
                               regex=["even{4}", None, "even+", "even+"])
    batch = run(model, prompts, 6, params, seeds)
    for r in range(4):
        alone = run(model, [prompts[r]], 6, params.replace(
            temperature=params.temperature[r], regex=params.regex[r]), [seeds[r]])
        assert alone.token_lists()[0] == batch.token_lists()[r]
        assert alone.finish_reason[0] == batch.finish_reason[r]
        np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[r], rtol=0, atol=1e-6)
    assert batch.finish_reason[0] == "eos" and batch.token_lists()[0][-1] == EOS
    assert all(t % 2 == 0 for t in batch.token_lists()[2] if t != EOS)


def test_tables_of_one_bucket_share_the_program_and_free_batches_build_none(stand_in, automata):
    """even{4} and even{5} have 6 and 7 states, both padded to 8: the second pattern (and a
    free row beside it) compiles nothing new. A batch without a pattern builds no table."""
    run(stand_in, [[3]], 8, GREEDY.replace(regex="even{4}"))
    with compiles.count_compiles() as counts:
        out = run(stand_in, [[3]], 8, GREEDY.replace(regex="even{5}"))
    assert out.token_lists() == [[4, 0, 0, 0, 0, EOS]]
    assert counts["_decode_loop"] == 0 and counts["prefill"] == 0
    calls = automata.calls
    assert run(stand_in, [[3]], 2).token_lists() == [[4, 5]] and automata.calls == calls


def test_a_state_that_allows_nothing_fails_the_row_and_never_samples_from_it(stand_in):
    """The builder trims its automata, so no row can reach a state without an allowed token;
    an untrimmed table's dead end fails the row ("error", or the ValueError that names it)
    after the tokens before it, with no NaN among them, while the other rows finish."""
    params = GREEDY.replace(regex=["even{1}!", "even+"])
    out = run(stand_in, [[3], [3]], 4, params, raise_on_error=False)
    assert out.token_lists() == [[4], [4, 0, 0, 0]] and out.finish_reason == ["error", "length"]
    assert not np.isnan(out.logprobs[out.valid]).any()
    with pytest.raises(ValueError, match=r"row 0 after 1 tokens: no token .* \(the constraint"):
        run(stand_in, [[3]], 4, params.replace(regex="even{1}!"))


# --- beam_search ----------------------------------------------------------------------------------


def beams(model, prompts, n, width=2, **options):
    return dl.beam_search(model, prompts, width, n,
                          options=dl.BeamOptions(eos_ids=[EOS], **options))


def test_each_beam_carries_its_own_state_and_ends_only_where_complete(stand_in):
    """even{2} from 3: step 1 keeps 4 (logit 10) and 0 among the 16 allowed even ids; step 2
    extends 4 by the masked 5's tied even ids (0 and 2 first, 1/16 each); then only EOS is
    allowed. A free prompt beside it decodes as unconstrained, 4 5 6."""
    out = beams(stand_in, [[3], [3]], 4, regex=["even{2}", None])
    first = 10.0 - np.log(np.exp(10.0) + 15.0)
    assert out.token_lists()[0] == [[4, 0, EOS], [4, 2, EOS]]
    assert out.finish_reason[0] == ["eos", "eos"]
    np.testing.assert_allclose(out.logprobs[0], first - np.log(16.0), rtol=0, atol=1e-5)
    assert out.token_lists()[1][0] == [4, 5, 6, 7]


def test_beams_out_of_budget_before_the_pattern_completes_are_incomplete(stand_in):
    """even+ is complete after one even id: there EOS ties with the 16 even ids (the odd
    favourite masked), and the EOS hypothesis enters the pool first, a running one at the
    budget second, complete ("length")."""
    out = beams(stand_in, [[3], [3]], 2, regex=["even{4}", "even+"])
    assert out.finish_reason == [["incomplete", "incomplete"], ["eos", "length"]]
    assert out.token_lists()[1] == [[4, EOS], [4, 0]]
    assert all(t % 2 == 0 for h in out.token_lists()[0] for t in h)


# --- speculative_generate and the engine ----------------------------------------------------------


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_speculative_greedy_equals_constrained_generate(stand_in, drafter):
    """Prompt lookup proposes what followed "3 4" before, 5: odd, so cut before the target
    sees it; a stand-in draft model (next = last + 2) proposes under the constraint. Either
    way the rounds give constrained generate's tokens, EOS and "incomplete" alike, the state
    rewound with the cache after each rejection."""
    draft = dl.NgramDrafter() if drafter == "ngram" else NextToken(V, skip_after=1)
    params = GREEDY.replace(regex=["even{4}", "even+", "even{9}"])
    prompts = [[3, 4, 5, 3], [3, 4, 5, 3], [6]]
    expected = run(stand_in, prompts, 8, params)
    out = dl.speculative_generate(stand_in, draft, prompts, params, 3, 8,
                                  options=dl.DecodeOptions(eos_ids=[EOS]))
    assert out.token_lists() == expected.token_lists()
    assert out.finish_reason == expected.finish_reason == ["eos", "length", "incomplete"]
    assert out.stats.tested.sum() > 0


def test_the_engine_serves_each_constrained_request_as_generate_does(automata):
    """Requests with two patterns and none, sampled and greedy, more than the slots (a slot
    freed by a constrained request takes a free one, a new pattern rebuilds the table while
    others run): each completion equals constrained generate on that request alone."""
    model = NextToken(V, margin=1.0)
    patterns = ["even{4}", None, "even+", "even{9}", "even+", "even{2}", None]
    requests = [serving.Request(id=i, prompt=(3 + i,), max_new_tokens=6 + i % 3, seed=i,
                                params=dl.SamplingParams(temperature=[1.0, 0.0][i % 2],
                                                         regex=p))
                for i, p in enumerate(patterns)]
    engine = serving.SlotEngine(model, 2, 32, options=serving.EngineOptions(eos_ids=[EOS]))
    done = engine.run(requests, n=3)
    for r in requests:
        alone = dl.generate(model, [list(r.prompt)], r.params, r.max_new_tokens, seed=[r.seed],
                            options=dl.DecodeOptions(eos_ids=[EOS], max_len=32))
        assert done[r.id].tokens == alone.token_lists()[0], r.id
        assert done[r.id].finish_reason == alone.finish_reason[0]
    assert done[0].finish_reason == "eos" and done[3].finish_reason == "incomplete"


def test_beams_rounds_and_the_engine_compile_once_per_table_bucket(stand_in, automata):
    """even{4} and even{5} share a table bucket (8 states): after one run with the first,
    beam search, speculative rounds and the engine serve the second (and free rows) with the
    programs they have, as generate does."""
    def spec(regex):
        return dl.speculative_generate(stand_in, dl.NgramDrafter(), [[3, 4, 5, 3], [6]],
                                       GREEDY.replace(regex=[regex, None]), 3, 8,
                                       options=dl.DecodeOptions(eos_ids=[EOS]))

    engine = serving.SlotEngine(stand_in, 2, 32, options=serving.EngineOptions(eos_ids=[EOS]))

    def serve(regex):
        return engine.run([serving.Request(id=i, prompt=(3 + i,), max_new_tokens=6,
                                           params=GREEDY.replace(regex=regex if i else None))
                           for i in range(3)], n=3)

    compiled = []
    for regex in ("even{4}", "even{5}"):
        with compiles.count_compiles() as counts:
            found = (beams(stand_in, [[3], [3]], 6, regex=[regex, None]), spec(regex),
                     serve(regex))
        compiled.append(sum(counts.values()))
    assert compiled[0] > 0 and compiled[1] == 0, compiled
    beam, rounds, served = found
    assert beam.token_lists()[0][0] == [4, 0, 0, 0, 0, EOS]
    assert rounds.token_lists()[0] == run(stand_in, [[3, 4, 5, 3]], 8,
                                          GREEDY.replace(regex="even{5}")).token_lists()[0]
    assert served[1].tokens[-1] == EOS or served[1].finish_reason == "incomplete"


def test_a_preempted_constrained_request_resumes_from_the_state_of_its_tokens(automata):
    """Paged memory too small for three growing requests: the newest is preempted and
    recomputed from prompt + its tokens, its automaton state from the state after them, and
    each ends as constrained generate alone."""
    model = NextToken(V, margin=1.0)
    requests = [serving.Request(id=i, prompt=(3 + i, 4), max_new_tokens=12, seed=i,
                                params=dl.SamplingParams(temperature=1.0, regex=p))
                for i, p in enumerate(["even{9}", "even+", "even{6}", None])]
    engine = serving.SlotEngine(model, 3, 32, kv_tokens=32, page_size=4,
                                options=serving.EngineOptions(eos_ids=[EOS]))
    out = serving.replay(engine, requests, serving.Continuous(), clock=serving.VirtualClock(),
                         steps_per_call=2)
    assert out.summary["preemptions"] >= 1 and out.summary["completed"] == len(requests)
    for record in out.records:
        r = requests[record.request_id]
        alone = dl.generate(model, [list(r.prompt)], r.params, 12, seed=[r.seed],
                            options=dl.DecodeOptions(eos_ids=[EOS], max_len=32))
        assert record.tokens == alone.token_lists()[0], r.id
        assert record.finish_reason == alone.finish_reason[0]


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, match", [
    (dict(regex="a", json_schema={"type": "string"}), "row 0 has both regex='a'"),
    (dict(regex=["a", None], json_schema=[None, {}, None]), "regex has 2 values but json_schema"),
    (dict(regex=[3]), r"regex\[0\] must be a str or None, got 3"),
    (dict(json_schema=4), "json_schema must be a dict or a JSON str or None, got 4"),
    (dict(regex=[]), "regex must be a str, None, or a non-empty list"),
])
def test_bad_patterns_are_refused_when_the_params_are_built(fields, match):
    with pytest.raises(ValueError, match=match):
        dl.SamplingParams(**fields)


def test_a_per_row_pattern_list_of_another_length_is_refused_before_compiling(stand_in):
    with compiles.count_compiles() as counts, pytest.raises(
            ValueError, match="regex has 2 values but the batch has 3 rows"):
        run(stand_in, [[1], [2], [3]], 4, GREEDY.replace(regex=["even+", None]))
    assert sum(counts.values()) == 0


def test_timed_rounds_refuse_a_constraint_they_would_ignore(stand_in):
    from decodelab.measure import speculation

    with pytest.raises(ValueError, match="params must be free of constraints for a timed round"):
        speculation.start_state(stand_in, dl.NgramDrafter(), None, [[3]],
                                GREEDY.replace(regex="even+"), 2, 16, 4)
