"""Request traces (seeded Poisson arrivals, length distributions, JSONL round trip and its errors)
and the metric conventions (TTFT, TPOT, percentiles, throughput, occupancy)."""


import numpy as np
import pytest

import decodelab as dl
from decodelab import serving
from decodelab.serving import Request, RequestRecord

PROMPTS = dict(kind="uniform", low=2, high=9)
LONG_TAIL = dict(kind="lognormal", median=8, sigma=1.0, cap=40)


def make(num=200, rate=5.0, outputs=LONG_TAIL, seed=0, **kwargs):
    return serving.poisson_trace(num, rate, PROMPTS, outputs, vocab_size=100, seed=seed, **kwargs)


def test_same_seed_same_trace_other_seed_other_trace():
    a, b, c = make(seed=1), make(seed=1), make(seed=2)
    key = lambda t: [(r.arrival, r.prompt, r.max_new_tokens, r.seed) for r in t]
    assert key(a) == key(b) != key(c)


def test_arrivals_are_poisson_at_the_rate():
    t = make(num=4000, rate=5.0)
    gaps = np.diff([r.arrival for r in t])
    assert t[0].arrival == 0.0 and np.all(gaps >= 0)
    # Mean gap 1/rate: the standard error of 3999 exponential gaps is 0.2 / sqrt(3999) ~ 0.0032.
    assert abs(gaps.mean() - 0.2) < 4 * 0.2 / np.sqrt(len(gaps))
    assert abs(np.std(gaps) / gaps.mean() - 1.0) < 0.05  # exponential: coefficient of variation 1


@pytest.mark.parametrize("spec,low,high", [
    (dict(kind="fixed", length=7), 7, 7),
    (dict(kind="uniform", low=3, high=5), 3, 5),
    (dict(kind="exponential", mean=10, cap=30), 1, 30),
    (LONG_TAIL, 1, 40),
])
def test_lengths_stay_in_range_and_prompts_in_vocabulary(spec, low, high):
    t = make(num=2000, outputs=spec)
    lengths = np.asarray([r.max_new_tokens for r in t])
    assert lengths.min() >= low and lengths.max() <= high
    assert all(2 <= len(r.prompt) <= 9 and max(r.prompt) < 100 for r in t)


def test_long_tail_has_a_tail():
    lengths = np.asarray([r.max_new_tokens for r in make(num=2000)])
    assert np.median(lengths) == 8 and np.percentile(lengths, 99) > 3 * np.median(lengths)
    assert (lengths == 40).any()  # the cap is reached


def test_jsonl_round_trip(tmp_path):
    t = make(num=20, params=dl.SamplingParams(temperature=0.7, top_k=5))
    t[3] = Request(id=3, prompt=[1, 2], max_new_tokens=4, stop_sequences=[[5, 6]],
                   arrival=t[3].arrival)
    back = serving.load_trace(serving.save_trace(t, tmp_path / "trace.jsonl"))
    fields = lambda r: (r.id, r.prompt, r.max_new_tokens, r.seed, r.stop_sequences, r.arrival,
                        r.params.temperature, r.params.top_k)
    assert [fields(r) for r in back] == [fields(r) for r in t]


def test_a_json_schema_keeps_its_property_order_through_a_trace_file(tmp_path):
    """Property order is the order of the output a schema constrains: a round trip keeps it."""
    schema = {"type": "object", "required": ["zeta", "alpha"],
              "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}}}
    trace = [Request(id=0, prompt=[1], max_new_tokens=4,
                     params=dl.SamplingParams(json_schema=schema))]
    (back,) = serving.load_trace(serving.save_trace(trace, tmp_path / "trace.jsonl"))
    assert back.params.json_schema == schema
    assert list(back.params.json_schema) == list(schema)
    assert list(back.params.json_schema["properties"]) == ["zeta", "alpha"]


@pytest.mark.parametrize("line,match", [
    ("{not json", "Expecting property name"),
    ('{"id": 9, "arrival": 0.5, "prompt": [1]}', r"missing fields \['max_new_tokens'\]"),
    ('{"id": 9, "arrival": 0.5, "prompt": [], "max_new_tokens": 2}', "prompt is empty"),
    ('{"id": 9, "arrival": -1, "prompt": [1], "max_new_tokens": 2}', "arrival must be"),
    ('{"id": 9, "arrival": 1, "prompt": [1], "max_new_tokens": 2, "params": {"top_p": 2}}',
     "top_p"),
    ('{"id": 9, "arrival": 1, "prompt": [1], "max_new_tokens": 2, "colour": 1}',
     "unknown fields"),
    ('{"id": 0, "arrival": 1, "prompt": [1], "max_new_tokens": 2}', "duplicate request id 0"),
    ("[1, 2]", "expected a JSON object"),
])
def test_a_malformed_line_is_a_value_error_naming_its_line(tmp_path, line, match):
    path = serving.save_trace(make(num=2), tmp_path / "trace.jsonl")
    path.write_text(path.read_text() + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"trace.jsonl:4: not a valid request: .*{match}"):
        serving.load_trace(path)


@pytest.mark.parametrize("kwargs,match", [
    (dict(rate=0.0), "rate must be a finite number > 0, got 0.0"),
    (dict(rate=-2.0), "rate must be a finite number > 0, got -2.0"),
    (dict(rate=float("inf")), "rate must be a finite number > 0"),
    (dict(num=0), "num_requests must be an int > 0, got 0"),
    (dict(outputs=dict(kind="zipf")), "kind in"),
    (dict(outputs=dict(kind="uniform", low=5, high=2)), "high must be an int >= low=5"),
    (dict(outputs=dict(kind="lognormal", median=8, sigma=1.0)), "bad fields"),
])
def test_bad_trace_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_load_trace_of_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="path must be an existing trace file"):
        serving.load_trace(tmp_path / "nope.jsonl")


def test_metric_conventions_by_hand():
    records = [
        RequestRecord(0, arrival=0.0, status="completed", admitted=0.5, first_token=1.0,
                      finish=3.0, tokens=[1, 2, 3, 4, 5]),  # TTFT 1, TPOT (3 - 1) / 4 = 0.5
        RequestRecord(1, arrival=1.0, status="completed", admitted=1.0, first_token=1.5,
                      finish=1.5, tokens=[7]),  # one token: no TPOT
        RequestRecord(2, arrival=2.0, status="rejected", error="too long", finish=2.0),
    ]
    s = serving.summarize(records, num_slots=2, busy_slot_seconds=3.0)
    assert (s["completed"], s["rejected"], s["output_tokens"]) == (2, 1, 6)
    assert s["makespan_s"] == 3.0 and s["output_tokens_per_s"] == 2.0
    assert s["requests_per_s"] == pytest.approx(2 / 3)
    assert s["ttft_p50_s"] == pytest.approx(0.75) and s["tpot_p50_s"] == 0.5
    assert s["latency_p99_s"] == pytest.approx(0.5 + 0.99 * 2.5)
    assert s["queue_mean_s"] == 0.25 and s["slot_occupancy"] == 0.5


def test_time_between_tokens_is_the_gap_between_deliveries():
    records = [
        RequestRecord(0, arrival=0.0, status="completed", admitted=0.0, first_token=1.0,
                      finish=3.0, tokens=[1, 2, 3, 4], deliveries=[1.0, 1.5, 3.0]),
        RequestRecord(1, arrival=1.0, status="completed", admitted=1.0, first_token=2.0,
                      finish=2.0, tokens=[5], deliveries=[2.0]),  # one delivery: no gap
    ]
    assert records[0].gaps == [0.5, 1.5] and records[0].max_tbt == 1.5
    assert records[1].gaps == [] and records[1].max_tbt is None
    s = serving.summarize(records, num_slots=2, busy_slot_seconds=3.0)
    assert s["tbt_p50_s"] == 1.0 and s["tbt_p99_s"] == pytest.approx(0.5 + 0.99)
    assert serving.per_request(records) == {
        "latency_s": [3.0, 1.0], "ttft_s": [1.0, 1.0], "tpot_s": [2 / 3, None],
        "max_tbt_s": [1.5, None], "tokens": [4, 1]}


def test_summarize_refuses_unfinished_requests():
    with pytest.raises(ValueError, match="1 unfinished"):
        serving.summarize([RequestRecord(0, arrival=0.0)], num_slots=1, busy_slot_seconds=0.0)
