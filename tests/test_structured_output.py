"""Structured output end to end (issue 33): patterns compiled by the real builder
(``sampling.automaton``, outlines-core) over a small spelled vocabulary, sampled by the loops.
``test_constrained`` tests the loops on hand-built tables; this shows the two sides meet."""

import re

import numpy as np
import pytest
from standins import Chain, Spelled, Uniform

import decodelab as dl

pytest.importorskip("outlines_core")

EOS = 0
# ids: EOS, the ten digits, "-", and two tokens that cross a pattern boundary ("9-", "-0")
SPELLING = [None, *(str(d).encode() for d in range(10)), b"-", b"9-", b"-0"]
VOCAB = Spelled(SPELLING)
DATE = r"\d{2}-\d{2}"


def text(ids):
    return b"".join(SPELLING[i] for i in ids if i != EOS).decode()


def test_every_sampled_row_is_a_match_ended_by_eos_and_no_row_fails():
    """A uniform model over 14 ids, 64 rows at temperature 1: every output spells the regex and
    ends with EOS (the trimmed automaton leaves no row without an allowed token), beside a
    free row that is not constrained."""
    model = Uniform(len(SPELLING))
    B = 64
    params = dl.SamplingParams(temperature=1.0, regex=[DATE] * (B - 1) + [None])
    out = dl.generate(model, [[EOS]] * B, params, 8, seed=list(range(B)),
                      options=dl.DecodeOptions(eos_ids=[EOS], tokenizer=VOCAB))
    tokens = out.token_lists()
    assert out.finish_reason[:-1] == ["eos"] * (B - 1)
    assert all(re.fullmatch(DATE, text(t)) and t[-1] == EOS for t in tokens[:-1])
    assert any(t in (12, 13) for row in tokens[:-1] for t in row)  # boundary tokens are used
    assert not np.isnan(out.logprobs[out.valid]).any()


def test_a_json_schema_as_a_dict_or_its_text_gives_the_same_output():
    model = Uniform(len(SPELLING))
    schema = {"type": "integer", "minimum": 0}
    outputs = [dl.generate(model, [[EOS]] * 4, dl.SamplingParams(temperature=1.0,
                                                                 json_schema=s), 6,
                           seed=[1, 2, 3, 4],
                           options=dl.DecodeOptions(eos_ids=[EOS], tokenizer=VOCAB))
               for s in (schema, '{"type": "integer", "minimum": 0}')]
    assert outputs[0].token_lists() == outputs[1].token_lists()
    for row, reason in zip(outputs[0].token_lists(), outputs[0].finish_reason):
        # a prefix of an integer; "incomplete" exactly when it is not one yet ("-")
        assert re.fullmatch(r"-?\d*", text(row)) and reason in ("eos", "length", "incomplete")
        assert (reason == "incomplete") == (not re.fullmatch(r"-?(0|[1-9]\d*)", text(row)))


def test_n_samples_of_a_constrained_prompt_each_match_and_sample_0_is_the_single_draw():
    """``n`` samples per prompt start from their prompt's automaton state: every sample of the
    constrained prompt spells the regex, the free prompt's samples are free, and sample 0 of
    each prompt is the ``n=1`` output for the same seed."""
    model = Uniform(len(SPELLING))
    params = dl.SamplingParams(temperature=1.0, regex=[DATE, None])
    options = dl.DecodeOptions(eos_ids=[EOS], tokenizer=VOCAB)
    many = dl.generate(model, [[EOS], [EOS]], params, 8, seed=[5, 6], n=4, options=options)
    one = dl.generate(model, [[EOS], [EOS]], params, 8, seed=[5, 6], options=options)
    samples = many.token_lists()
    assert all(re.fullmatch(DATE, text(t)) and t[-1] == EOS for t in samples[0])
    assert len({tuple(t) for t in samples[0]}) > 1  # independent draws, not copies
    assert [s[0] for s in samples] == one.token_lists()
    assert many.finish_reason[0] == ["eos"] * 4


def test_a_beam_that_completes_its_pattern_outranks_a_likelier_one_cut_off_by_the_budget():
    """``1|2222`` within 2 tokens, the model favouring "2" 18 to 1: "2 2" is the likelier
    hypothesis but cannot end before the budget ("incomplete"); "1" then EOS is complete, and a
    constrained search ranks it first."""
    table = np.full((len(SPELLING), len(SPELLING)), 0.05 / (len(SPELLING) - 2))
    table[:, 2], table[:, 3] = 0.05, 0.9  # ids 2 and 3 spell "1" and "2"
    out = dl.beam_search(Chain(table / table.sum(-1, keepdims=True)), [[EOS]], 2, 2,
                         options=dl.BeamOptions(eos_ids=[EOS], tokenizer=VOCAB,
                                                regex="1|2222"))
    assert out.token_lists()[0] == [[2, EOS], [3, 3]]
    assert out.finish_reason[0] == ["eos", "incomplete"]
    assert out.scores[0, 0] < out.scores[0, 1]  # ranked by completeness before score
