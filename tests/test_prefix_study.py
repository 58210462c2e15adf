"""The prefix-sharing study: its sweep, its workloads, real tiny points end to end through the
runner, the page in the one form from synthetic rows with known ratios, the roofline against a
hand-computed case, and a pool too small for one request refused by name."""

import pytest
from flax import nnx
from study_config import config_module, synthetic_row

import decodelab as dl
from decodelab import experiment, report
from decodelab.measure import prefix_sharing
from decodelab.serving import Request, SlotEngine


@pytest.fixture(scope="module")
def study():
    from experiments import prefix

    return prefix


def tiny_config(**overrides):
    module = config_module("prefix")
    return experiment.apply_overrides(module.get_config("tiny"), overrides)


def test_the_sweep_covers_each_workload_with_and_without_sharing():
    module = config_module("prefix")
    points = [p.config for p in experiment.expand(module.get_config(), module.get_sweep())]
    passk = sorted((c.n, c.sharing) for c in points if c.workload == "passk")
    assert passk == sorted((n, s) for n in (1, 2, 4, 8, 16, 32) for s in (True, False))
    assert [c.sharing for c in points if c.workload == "trace"] == [True, False]
    assert all(c.system == 256 and c.question == 32 and c.max_len == 320 for c in points)


def test_the_workloads_share_one_system_prompt(study):
    trace = study.workload(tiny_config(workload="trace"))
    assert len(trace) == 4 and len({tuple(r.prompt[:24]) for r in trace}) == 1
    assert len({tuple(r.prompt[24:]) for r in trace}) == 4
    shared = study.workload(tiny_config(workload="passk", n=4))
    separate = study.workload(tiny_config(workload="passk", n=4, sharing=False))
    assert [r.n for r in shared] == [4] and [r.n for r in separate] == [1] * 4
    assert {tuple(r.prompt) for r in separate} == {tuple(shared[0].prompt)}
    miss, hit = (study.workload(tiny_config(workload="hit"), s)[0] for s in (0, 1))
    assert miss.prompt[:24] == hit.prompt[:24] and miss.prompt[24:] != hit.prompt[24:]
    with pytest.raises(ValueError, match="workload must be one of"):
        study.evaluate(tiny_config(workload="beam"), None)


@pytest.fixture(scope="module")
def rows(study, tmp_path_factory):
    """Real tiny points, run by the runner: the trace and passk n=4, shared and separate, and
    the hit workload."""
    points = [{"workload": w, "sharing": s} for w in ("trace",) for s in (True, False)]
    points += [{"workload": "passk", "n": 4, "sharing": s} for s in (True, False)]
    points += [{"workload": "hit"}]
    return experiment.run(tiny_config(), points, study.evaluate,
                          tmp_path_factory.mktemp("prefix"), progress=False)


def test_sharing_prefills_the_prefix_once(rows):
    shared, separate, k_shared, k_separate, hit = (r["metrics"] for r in rows)
    # 4 requests of 24 + 8 tokens: the first prefills 32, the others wait a call and compute
    # their 8 question tokens (the 24-token prefix is 3 whole pages of 8).
    assert (shared["prefill_tokens"], separate["prefill_tokens"]) == (32 + 3 * 8, 4 * 32)
    # One prompt drawn 4 times: the leader's 32 tokens, then each sample its last token.
    assert (k_shared["prefill_tokens"], k_separate["prefill_tokens"]) == (32 + 3, 4 * 32)
    assert (hit["miss_prefill_tokens"], hit["hit_prefill_tokens"]) == (32, 8)
    for m in (shared, separate, k_shared, k_separate):
        assert m["preemptions"] == 0 and len(m["rep_ttft_s"]) == 2
    assert len(hit["hit_ttft_s"]) == 2


def synthetic_rows() -> list[dict]:
    """Rows of the real sweep with metrics of known ratios: sharing computes a quarter of the
    prefill tokens and reaches first tokens in a fifth of the time; a hit takes half a miss's."""
    module = config_module("prefix")
    out = []
    for p in experiment.expand(module.get_config(), module.get_sweep()):
        c = p.config
        if c.workload == "hit":
            metrics = {"miss_ttft_s": [0.10, 0.11, 0.09], "hit_ttft_s": [0.05, 0.055, 0.045],
                       "miss_prefill_tokens": 288, "hit_prefill_tokens": 32}
        else:
            f = 0.25 if c.sharing else 1.0
            metrics = {"prefill_tokens": int(1000 * f), "peak_pages": int(40 * f),
                       "preemptions": 0, "output_tokens": 256,
                       "rep_ttft_s": [0.2 * f, 0.21 * f], "rep_output_tokens_per_s": [500, 510],
                       "rep_all_first_s": [(0.2 if c.sharing else 1.0) * x for x in (1, 1.05)]}
        out.append(synthetic_row("prefix", p, metrics))
    return out


def test_the_claims_and_page_from_synthetic_rows(study, tmp_path):
    rows = synthetic_rows()
    tokens, seconds, hit, roofline = [claim.judge(rows) for claim in study.CLAIMS]
    assert tokens.measured == pytest.approx(0.25) and tokens.verdict.side == 1
    assert seconds.measured.value == pytest.approx(0.2) and seconds.verdict.side == 1
    assert hit.measured.value == pytest.approx(0.5) and hit.verdict.text == "not met"
    # 16 requests at the GPU config: the 256-token pass reads the weights (16.06 GB at 3.35
    # TB/s), the 16 x 32 questions and the 16 x 288 separate prompts are compute-bound.
    flops = 2 * 8.03e9 / 989e12
    assert roofline.measured == pytest.approx(
        (2 * 8.03e9 / 3.35e12 + flops * 16 * 32) / (flops * 16 * 288))
    done = report.render(study.forms(rows)[0], rows, tmp_path)
    page = done.page.read_text()
    assert page.startswith("# What do shared prompt pages save: prefill, time to first token, "
                           "memory?\n\nEight samples from one prefill computed 0.25")
    assert "| system prompt hit | 1 | prefix cache | 32 |" in page
    assert sorted(p.name for p in done.written) == [
        "prefix.csv", "prefix.md", "prefix.png", "prefix_points.csv"]


def test_prefill_seconds_is_the_roofline():
    # 1e9 parameters, 100 tokens: 2e11 FLOPs at 1e12/s (0.2 s) against 2e9 bytes at 1e12 B/s.
    assert prefix_sharing.prefill_seconds(1e9, 100, 1e12, 1e12) == pytest.approx(0.2)
    assert prefix_sharing.prefill_seconds(1e9, 1, 1e12, 1e12) == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="bandwidth must be"):
        prefix_sharing.prefill_seconds(1e9, 1, 0, 1e12)


def test_a_prefix_cache_too_small_for_one_request_is_refused(tiny_config):
    model = dl.Transformer(tiny_config.replace(position="rope"), rngs=nnx.Rngs(0))
    engine = SlotEngine(model, 2, 64, kv_tokens=32, page_size=8, prefix_cache=True)
    request = Request("r", list(range(30)), 10)
    assert "more than the whole pool (kv_tokens=32)" in engine.check(request)
    with pytest.raises(ValueError, match="request 'r' cannot be served.*whole pool"):
        engine.run([request])
    with pytest.raises(ValueError, match="request 'r' cannot be served.*whole pool"):
        prefix_sharing.serve(engine, [request], steps_per_call=1)
    wide = Request("w", [1, 2], 4, n=3)  # more samples than slots: room never admits it
    with pytest.raises(ValueError, match="'w' does not fit the idle engine: n=3 samples"):
        prefix_sharing.serve(engine, [wide], steps_per_call=1)
