"""Diverse (group) beam search: one group is beam search itself; a hand-checked chain where the
penalty changes group 2's choice (and stays out of the scores); a plain-Python reference on random
chains; a zero penalty gives every group the same beams; a large one distinct first tokens;
penalties compile once; bad input is refused before anything is traced."""

import numpy as np
import pytest
from standins import DISAGREE, Chain, Spelled, chain_logp

import decodelab as dl
from decodelab import experiment

V = 8  # standins.DISAGREE's vocabulary


def groups(G, penalty, **more):
    return dl.BeamOptions(num_beam_groups=G, diversity_penalty=penalty, **more)


@pytest.mark.parametrize("penalty, best", [(0.1, [[1, 6], [1, 6]]), (0.5, [[2, 3], [1, 6]])])
def test_the_penalty_changes_the_second_groups_choice_and_not_the_scores(penalty, best):
    """Two groups of one beam. Group 1 takes 1 then 6. Group 2 weighs 1 at log 0.5 - penalty
    against 2 at log 0.4: at 0.1 it takes 1 too, and then 6 (log 0.4 - 0.1 > log 0.3); at 0.5
    it takes 2, then 3. The returned log-probabilities are the model's, unpenalised."""
    out = dl.beam_search(Chain(DISAGREE), [[0]], 2, 2, options=groups(2, penalty))
    assert out.token_lists()[0] == best
    expected = [np.log(DISAGREE[0, h[0]] * DISAGREE[h[0], h[1]]) for h in best]
    np.testing.assert_allclose(out.logprobs[0], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out.scores, out.logprobs, rtol=0, atol=0)


def gnmt(n, alpha):
    return ((5 + n) / 6) ** alpha


def reference_groups(table, prompt, width, G, budget, alpha, eos, penalty):
    """The documented algorithm, one hypothesis at a time. Each group: the W / G best EOS
    extensions enter its pool (the W / G best finished), the W / G best other extensions by
    log-probability minus ``penalty`` times the earlier groups' running beams with that token
    run on, at the budget they join the pool; a group stops early when its pool is full and
    no running beam can beat its worst. The pools are merged and ranked."""
    Wg = width // G
    running, pools, done = [[((), 0.0)] for _ in range(G)], [[] for _ in range(G)], [False] * G
    for n in range(1, budget + 1):
        counts = np.zeros(len(table))
        for g in range(G):
            if done[g]:
                continue
            extended = [(out + (t,), lp + chain_logp(table, list(prompt) + list(out))[t])
                        for out, lp in running[g] for t in range(len(table))]
            ended = sorted([c for c in extended if c[0][-1] in eos], key=lambda c: -c[1])[:Wg]
            goes = [c for c in extended if c[0][-1] not in eos]
            running[g] = sorted(goes, key=lambda c: -(c[1] - penalty * counts[c[0][-1]]))[:Wg]
            running[g] = [c for c in running[g] if c[1] > -np.inf]
            for out, _ in running[g]:
                counts[out[-1]] += 1
            pool = pools[g] + [(out, lp, lp / gnmt(n, alpha), "eos") for out, lp in ended]
            if n == budget:
                pool += [(out, lp, lp / gnmt(n, alpha), "length") for out, lp in running[g]]
            pools[g] = sorted(pool, key=lambda h: -h[2])[:Wg]
            best = max((lp for _, lp in running[g]), default=-np.inf)
            done[g] = best == -np.inf or (len(pools[g]) == Wg and
                                          best / gnmt(budget, alpha) <= pools[g][-1][2])
    return sorted([h for pool in pools for h in pool], key=lambda h: -h[2])


@pytest.mark.parametrize("seed, width, G, alpha, penalty",
                         [(0, 4, 2, 0.0, 0.7), (1, 6, 3, 0.6, 1.5), (2, 4, 4, 1.0, 0.3)])
def test_matches_the_reference_on_random_chains_with_eos(seed, width, G, alpha, penalty):
    rng = np.random.default_rng(seed)
    Vr, eos = 7, (5, 6)
    table = rng.dirichlet(np.full(Vr, 0.5), size=(Vr, Vr))  # [V, V, V]
    table[:, :, list(eos)] *= 0.3
    table /= table.sum(axis=-1, keepdims=True)
    prompts = [[0], [1, 2], [3, 0, 1]]
    out = dl.beam_search(Chain(table), prompts, width, 5, length_penalty=alpha,
                         options=groups(G, penalty, eos_ids=list(eos)))
    for p, prompt in enumerate(prompts):
        expected = reference_groups(table, prompt, width, G, 5, alpha, eos, penalty)
        assert [tuple(h) for h in out.token_lists()[p]] == [h[0] for h in expected]
        np.testing.assert_allclose(out.logprobs[p], [h[1] for h in expected], rtol=0, atol=1e-5)
        np.testing.assert_allclose(out.scores[p], [h[2] for h in expected], rtol=0, atol=1e-5)
        assert out.finish_reason[p] == [h[3] for h in expected]


RANDOM = np.random.default_rng(3).dirichlet(np.full(V, 0.5), size=(V, V))
PROMPTS = [[0], [1, 2], [3, 0, 1]]


def test_one_group_is_beam_search_and_the_same_program():
    plain = dl.beam_search(Chain(RANDOM), PROMPTS, 4, 5, length_penalty=0.6,
                           options=dl.BeamOptions(eos_ids=[6, 7]))
    with experiment.count_traces() as counts:
        one = dl.beam_search(Chain(RANDOM), PROMPTS, 4, 5, length_penalty=0.6,
                             options=groups(1, 2.0, eos_ids=[6, 7]))
    assert not counts
    assert one.token_lists() == plain.token_lists()
    np.testing.assert_array_equal(one.scores, plain.scores)
    np.testing.assert_array_equal(one.logprobs, plain.logprobs)
    assert one.finish_reason == plain.finish_reason


def test_without_a_penalty_every_group_is_the_same_beam_search():
    """G groups of W / G beams, no penalty: each group finds beam search of width W / G, so
    each of its hypotheses comes back G times in a row (equal scores: the lower group first)."""
    narrow = dl.beam_search(Chain(RANDOM), PROMPTS, 2, 5, options=dl.BeamOptions(eos_ids=[6]))
    out = dl.beam_search(Chain(RANDOM), PROMPTS, 6, 5, options=groups(3, 0.0, eos_ids=[6]))
    for p in range(len(PROMPTS)):
        assert out.token_lists()[p] == [h for h in narrow.token_lists()[p] for _ in range(3)]
        np.testing.assert_array_equal(out.scores[p], np.repeat(narrow.scores[p], 3))


def test_a_large_penalty_gives_each_group_its_own_first_token():
    """Four groups of one beam: plain beam search of 4 starts its beams with repeated tokens on
    every prompt; under a large penalty each group's first token is new."""
    plain = dl.beam_search(Chain(RANDOM), PROMPTS, 4, 3)
    out = dl.beam_search(Chain(RANDOM), PROMPTS, 4, 3, options=groups(4, 1e3))
    for p in range(len(PROMPTS)):
        assert len({h[0] for h in out.token_lists()[p]}) == 4
        assert len({h[0] for h in plain.token_lists()[p]}) < 4


def test_groups_keep_their_own_constraint_states_and_complete_hypotheses_rank_first():
    """Each group of one beam under the regex "1|2222" (ids 2 and 3 spell "1" and "2"; "2" is
    far likelier). Group 1 takes "2", "2" and is cut off incomplete; group 2, steered off "2",
    spells "1" and ends. Merged, the complete hypothesis ranks first despite its lower score."""
    pytest.importorskip("outlines_core")
    spelling = [None, *(str(d).encode() for d in range(10))]
    table = np.full((11, 11), 0.05 / 9)
    table[:, 2], table[:, 3] = 0.05, 0.9
    out = dl.beam_search(Chain(table / table.sum(-1, keepdims=True)), [[0]], 2, 2,
                         options=groups(2, 10.0, eos_ids=[0], tokenizer=Spelled(spelling),
                                        regex="1|2222"))
    assert out.token_lists()[0] == [[2, 0], [3, 3]]
    assert out.finish_reason[0] == ["eos", "incomplete"]
    assert out.scores[0, 0] < out.scores[0, 1]


def test_penalties_compile_once_per_group_count():
    with experiment.count_traces() as counts:
        for penalty in [0.0, 0.5, 3.0]:
            dl.beam_search(Chain(DISAGREE), [[0], [2]], 4, 3, options=groups(2, penalty))
        assert counts["_beam_loop"] == 1 and counts["beam_prefill"] == 1


@pytest.mark.parametrize("options, message", [
    (groups(3, 1.0), r"num_beam_groups must divide width=4 .*, got 3"),
    (groups(0, 1.0), r"num_beam_groups must be an int >= 1, got 0"),
    (groups(2.0, 1.0), r"num_beam_groups must be an int >= 1, got 2.0"),
    (groups(8, 1.0), r"num_beam_groups must divide width=4 .*, got 8"),
    (groups(2, -0.5), r"diversity_penalty must be a finite number in \[0, .*\], got -0.5"),
    (groups(2, float("inf")), r"diversity_penalty must be a finite number in \[0, .*\], got inf"),
    (groups(2, "1"), r"diversity_penalty must be a finite number in \[0, .*\], got '1'"),
])
def test_bad_input_is_rejected_before_anything_is_traced(options, message):
    model = Chain(DISAGREE)
    with experiment.count_traces() as counts, pytest.raises(ValueError, match=message):
        dl.beam_search(model, [[0]], 4, 3, options=options)
    assert not counts
