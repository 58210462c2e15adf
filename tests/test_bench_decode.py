"""The decode-speed benchmark's point function, page and roofline arithmetic, on the tiny preset
with a few tokens. These check what is reported and how the figures relate, never how fast anything
is."""

import csv
import importlib.util
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import requires
from flax import nnx
from study_config import config_module

from decodelab import experiment, report, sampling
from decodelab.config import ModelConfig
from decodelab.experiment import presets
from decodelab.measure import ablation, peers, roofline, timing
from decodelab.model import Transformer, attention
from decodelab.sampling.params import SamplingParams
from experiments import bench_decode

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEPT = ROOT / "results" / "rows" / "bench_decode"

# In CI the test extra installs the peer, so its tests run there (and fail if it is missing).
HAS_PEER = bool(os.environ.get("CI")) or all(importlib.util.find_spec(m)
                                             for m in ("torch", "transformers"))


def small_config(**changes):
    """The tiny preset, batch 2, 8 new tokens, one repetition, small probes, no peer."""
    config = config_module("bench_decode").get_config("tiny")
    overrides = {"preset": "tiny", "batch_size": 2, "new_tokens": 8, "repeats": 1,
                 "roofline.bandwidth_mib": 4, "roofline.matmul_n": 64, "roofline.repeats": 1,
                 "nocache.lengths": 2, "nocache.repeats": 1, "peer.enabled": False, **changes}
    return experiment.apply_overrides(config, overrides)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bench")
    return experiment.run(small_config(), [{}], bench_decode.benchmark, workdir, progress=False)


@pytest.fixture(scope="module")
def metrics(rows):
    return rows[0]["metrics"]


def render(rows, out_dir) -> tuple[str, report.Rendered]:
    """The study's one page rendered from ``rows``: its text and what was written."""
    (form,) = bench_decode.forms(rows)
    done = report.render(form, rows, out_dir)
    return done.page.read_text(), done


def csv_rows(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_gpu_rows_render_their_own_page_beside_the_cpu_one(rows, tmp_path):
    gpu = [dict(r, provenance=dict(r["provenance"], backend="gpu",
                                   device_kind="NVIDIA H200")) for r in rows]
    text, done = render(gpu, tmp_path)
    assert done.page.name == "decode_speed_gpu.md"
    assert text.startswith("# How fast does dl.generate decode on a GPU, against")
    assert "gpu backend, device 'NVIDIA H200'" in text
    assert bench_decode.forms(rows)[0].name == "decode_speed"


def test_the_transformers_peer_runs_where_jax_runs():
    torch = pytest.importorskip("torch")
    assert peers.peer_device(torch) == ("cuda" if jax.default_backend() == "gpu"
                                        and torch.cuda.is_available() else "cpu")


def test_the_sweep_covers_three_presets_at_three_batch_sizes_with_their_fields():
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config(), module.get_sweep())
    assert [(p.config.preset, p.config.batch_size) for p in points] == [
        (p, b) for p in ("tiny", "small", "medium") for b in (1, 8, 32)]
    medium = points[-1].config
    assert medium.model.d_model == presets.MODEL_PRESETS["medium"]["d_model"]
    assert (medium.prompt_len, medium.new_tokens, medium.vocab_size) == (32, 256, 4096)


def test_the_max_len_sweep_runs_small_at_batch_8_in_three_cache_sizes_without_peers():
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config("max_len"), module.get_sweep("max_len"))
    assert [(p.config.preset, p.config.batch_size, p.config.max_len) for p in points] == [
        ("small", 8, 288), ("small", 8, 1024), ("small", 8, 4096)]
    config = points[0].config
    assert config.study == "max_len" and config.prompt_len + config.new_tokens == 288
    assert config.model.d_model == presets.MODEL_PRESETS["small"]["d_model"]
    assert (config.peer.enabled, config.nocache.enabled, config.breakdown.enabled) == (
        False, False, False)


def test_the_breakdown_sweep_splits_small_at_batch_1_8_and_32():
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config("breakdown"), module.get_sweep("breakdown"))
    assert [(p.config.preset, p.config.batch_size) for p in points] == [
        ("small", 1), ("small", 8), ("small", 32)]
    assert all(p.config.study == "breakdown" and p.config.breakdown.enabled for p in points)


def test_the_main_sweep_times_sampled_decoding_beside_greedy():
    config = config_module("bench_decode").get_config()
    assert (config.study, config.max_len, config.breakdown.enabled) == ("speed", 0, False)
    assert (config.sampled.enabled, config.sampled.temperature, config.sampled.top_p) == (
        True, 0.8, 0.95)


def test_every_figure_is_present_and_finite_and_the_peer_is_na_when_disabled(metrics):
    numeric = ["compile_s", "prefill_ms", "step_ms", "generate_s", "tokens_per_s",
               "bandwidth_gb_s", "matmul_gflop_s", "roofline_step_ms", "roofline_tokens_per_s",
               "nocache_generate_s", "nocache_tokens_per_s", "cache_speedup",
               "sampled_step_ms", "sampled_tokens_per_s", "sampled_generate_s"]
    for name in numeric:
        assert isinstance(metrics[name], float) and math.isfinite(metrics[name]), name
        assert metrics[name] >= 0, name
    assert metrics["params"] == presets.build_model_config(
        presets.model_section("tiny"), 4096).num_params()
    assert metrics["roofline_bound"] in ("memory", "compute")
    assert (metrics["hf_tokens_per_s"], metrics["speed_vs_hf"], metrics["hf_step_ms"],
            metrics["hf_generate_reps_s"]) == (None, None, None, None)
    assert metrics["hf_version"] == "not run"
    # llama.cpp runs only on a pretrained preset's GGUF file.
    assert (metrics["llama_version"], metrics["speed_vs_llama_f32"]) == ("not run", None)
    assert metrics["step_bytes"] == roofline.step_cost(
        presets.build_model_config(presets.model_section("tiny"), 4096), 2, 32 + 8 // 2).bytes


def test_speeds_and_ratios_follow_from_the_times(metrics):
    B, N = 2, 8
    assert metrics["tokens_per_s"] == pytest.approx(B * N / metrics["generate_s"], rel=1e-12)
    assert metrics["nocache_tokens_per_s"] == pytest.approx(
        B * N / metrics["nocache_generate_s"], rel=1e-12)
    assert metrics["cache_speedup"] == pytest.approx(
        metrics["tokens_per_s"] / metrics["nocache_tokens_per_s"], rel=1e-12)
    assert metrics["roofline_tokens_per_s"] == pytest.approx(
        B / (metrics["roofline_step_ms"] / 1e3), rel=1e-12)
    # Each further token's cost: the whole call minus the first token's, clipped at 0 (noise).
    assert metrics["step_ms"] == pytest.approx(
        max(1e3 * metrics["generate_s"] - metrics["prefill_ms"], 0.0) / (N - 1), abs=1e-9)
    if metrics["step_ms"] > 0:
        assert metrics["roofline_ratio"] == pytest.approx(
            metrics["roofline_step_ms"] / metrics["step_ms"], rel=1e-12)
    else:
        assert metrics["roofline_ratio"] is None
    # 8 new tokens from a 32-token prompt: lengths 32 .. 39, the first and last timed.
    assert metrics["nocache_lengths_timed"] == 2
    assert metrics["sampled_tokens_per_s"] == pytest.approx(
        B * N / metrics["sampled_generate_s"], rel=1e-12)
    if metrics["step_ms"] > 0:
        assert metrics["sampled_vs_greedy"] == pytest.approx(
            metrics["sampled_step_ms"] / metrics["step_ms"], rel=1e-12)
    assert (metrics["study"], metrics["max_len"]) == ("speed", 32 + N)
    # The repetitions behind each median are kept (one here: repeats=1).
    assert metrics["generate_reps_s"] == [metrics["generate_s"]]
    assert metrics["prefill_reps_s"] == [pytest.approx(metrics["prefill_ms"] / 1e3, rel=1e-12)]
    assert len(metrics["sampled_generate_reps_s"]) == 1


def test_a_breakdown_applies_the_ablations_cumulatively_and_its_parts_sum_to_the_step(
        monkeypatch, tiny_config):
    # A stand-in for the timing whose step time says which parts were still there: attention
    # costs 2 ms, the rest of the model 4, sampling 8, the loop 1.
    def step_ms(*args):
        present = {"attention": attention.blocked_attention is not ablation.no_attention,
                   "model": Transformer.__call__ is not ablation.no_model,
                   "sampling": sampling.draw is not ablation.draw_argmax}
        return {"step_ms": 1.0 + 2.0 * (present["attention"] and present["model"])
                + 4.0 * present["model"] + 8.0 * present["sampling"]}

    monkeypatch.setattr(timing, "time_generate", step_ms)
    originals = [getattr(owner, name) for _, _, patches in ablation.ABLATIONS
                 for owner, name, _ in patches]
    out = ablation.time_breakdown(None, None, 8, 1, None, 0, "greedy")
    assert out == {"breakdown_greedy_full_step_ms": 15.0,
                   "breakdown_greedy_no_attention_step_ms": 13.0,
                   "breakdown_greedy_no_model_step_ms": 9.0,
                   "breakdown_greedy_no_sampling_step_ms": 1.0,
                   "breakdown_greedy_attention_ms": 2.0,
                   "breakdown_greedy_mlp_projections_ms": 4.0,
                   "breakdown_greedy_sampling_ms": 8.0,
                   "breakdown_greedy_loop_ms": 1.0}
    assert [getattr(owner, name) for _, _, patches in ablation.ABLATIONS
            for owner, name, _ in patches] == originals  # every patch is undone


def test_an_unknown_ablation_level_is_refused():
    with pytest.raises(ValueError, match="level must be one of .*'no_sampling'.*, got 'none'"):
        with ablation.ablated("none"):
            pass


def test_generate_runs_with_every_ablation_applied(tiny_config):
    model = Transformer(tiny_config, rngs=nnx.Rngs(0))
    prompts = np.zeros((2, 5), np.int32)
    sampled = SamplingParams(temperature=0.8, top_p=0.95)
    with ablation.ablated("no_sampling"):  # the deepest level: every stand-in is traced
        timed = timing.time_generate(model, prompts, 2, 1, sampled)
    assert timed["tokens_per_s"] > 0  # time_generate checked that each row made 2 tokens


def test_the_page_adds_the_max_len_and_breakdown_csvs_from_their_rows(rows, tmp_path):
    base = rows[0]

    def study_row(study, **metrics):
        return {**base, "config": {**base["config"], "study": study},
                "metrics": {**base["metrics"], "study": study, **metrics}}

    breakdown = {f"breakdown_greedy_{level}_step_ms": ms for level, ms in
                 zip(("full", "no_attention", "no_model", "no_sampling"), (4.0, 3.0, 1.0, 0.5))}
    breakdown.update({f"breakdown_greedy_{part}_ms": ms for part, ms in
                      zip(ablation.PARTS, (1.0, 2.0, 0.5, 0.5))})
    breakdown.update({f"breakdown_sampled_{level}_step_ms": ms for level, ms in
                      zip(("full", "no_attention", "no_model", "no_sampling"), (10, 9, 1, 0.5))})
    breakdown.update({f"breakdown_sampled_{part}_ms": ms for part, ms in
                      zip(ablation.PARTS, (1.0, 8.0, 0.5, 0.5))})
    extra = [study_row("max_len", max_len=40, step_ms=2.0),
             study_row("max_len", max_len=400, step_ms=2.2),
             study_row("breakdown", **breakdown)]
    page, done = render(rows + extra, tmp_path)
    assert {p.name for p in done.written} >= {"decode_speed_max_len.csv",
                                              "decode_speed_breakdown.csv"}
    lengths = csv_rows(tmp_path / "decode_speed_max_len.csv")
    assert [(r["max_len"], r["live tokens at the end"], r["decodelab step ms"]) for r in lengths] \
        == [("40", "40", "2.0"), ("400", "40", "2.2")]
    assert float(lengths[1]["step / step at the smallest max_len"]) == pytest.approx(1.1)
    (greedy, _) = csv_rows(tmp_path / "decode_speed_breakdown.csv")
    assert list(greedy.values()) == ["tiny", "2", "greedy", "4.0", "1.00 (25%)", "2.00 (50%)",
                                     "0.500 (12%)", "0.500 (12%)"]
    # One repetition kept: the step ratio has no interval, so the target is not judged.
    assert ("| step at the largest max_len / at the smallest (the same live tokens) | n/a | "
            "<= 1.10x | not measured |") in page
    assert "the largest part per row: tiny batch 2: MLP and projections (50% of 4.00 ms)" in page
    # Sampling's whole cost: the sampled step (10 ms) minus the greedy step (4 ms).
    assert ("the sampled step minus the greedy step: tiny batch 2 6.00 ms (60% of the sampled "
            "step)") in page


def test_the_page_sets_llama_cpp_beside_decodelab_with_each_sides_bytes_and_roofline(
        rows, tmp_path):
    base = rows[0]
    llama = {"step_bytes": 8e6, "tokens_per_s": 40.0, "step_ms": 20.0, "roofline_step_ms": 10.0,
             "roofline_ratio": 0.5, "llama_version": "0.3.36", "speed_vs_llama": 0.4,
             "speed_vs_llama_f32": 0.8}
    for key, (mb, tok_s, step, roof) in {"llama": (2.0, 100.0, 8.0, 2.0),
                                         "llama_f32": (8.0, 50.0, 16.0, 8.0)}.items():
        llama.update({f"{key}_bytes_per_token": mb * 1e6, f"{key}_tokens_per_s": tok_s,
                      f"{key}_step_ms": step, f"{key}_roofline_step_ms": roof,
                      f"{key}_roofline_ratio": roof / step})
    row = {**base, "metrics": {**base["metrics"], **llama}}
    page, done = render([row], tmp_path)
    assert tmp_path / "decode_speed_llama_cpp.csv" in done.written
    table = [[r[c] for c in ("implementation", "weights", "MB read per token", "tok/s", "step ms",
                             "roofline step ms", "step / own roofline", "decodelab tok/s / this")]
             for r in csv_rows(tmp_path / "decode_speed_llama_cpp.csv")]
    assert table == [
        ["decodelab", "float32 (dequantized by decodelab)", "8.0", "40.0", "20.0", "10.0", "0.5",
         "1.0"],
        ["llama.cpp 0.3.36", "float32 (converted by llama.cpp)", "8.0", "50.0", "16.0", "8.0",
         "0.5", "0.8"],
        ["llama.cpp 0.3.36", "as stored in the file", "2.0", "100.0", "8.0", "2.0", "0.25", "0.4"]]
    assert ("llama.cpp runs 100 tok/s: decodelab (tiny batch 2) is 0.400x its speed") in page
    # One repetition or none kept (rows of an earlier version): no interval, so not judged.
    assert ("| tiny batch 2: decodelab / llama.cpp on float32 weights (pretrained, batch 1) | n/a "
            "| >= 1.00x | not measured |") in page


def test_targets_are_judged_by_the_intervals_of_the_repetitions(rows, tmp_path):
    # Batch 2 x 8 tokens: decodelab's median 0.4 s is 40 tokens/s; llama.cpp's 8 tokens in a
    # median 0.16 s are 50 tokens/s: 0.8x, its interval below the 1.0x target.
    base = rows[0]
    llama = {"step_bytes": 8e6, "llama_version": "0.3.36", "speed_vs_llama": 0.4,
             "speed_vs_llama_f32": 0.8, "generate_reps_s": [0.39, 0.40, 0.41, 0.40, 0.40],
             "prefill_reps_s": [0.30, 0.31, 0.30, 0.29, 0.30], "roofline_step_ms": 5.0}
    for key, seconds in {"llama": 0.08, "llama_f32": 0.16}.items():
        llama.update({f"{key}_bytes_per_token": 1e6, f"{key}_tokens_per_s": 8 / seconds,
                      f"{key}_step_ms": 1.0, f"{key}_roofline_step_ms": 1.0,
                      f"{key}_roofline_ratio": 1.0,
                      f"{key}_generate_reps_s": [seconds * f for f in (0.99, 1, 1.01, 1, 1)]})
    row = {**base, "metrics": {**base["metrics"], **llama}}
    page, _ = render([row], tmp_path)
    assert ("| tiny batch 2: decodelab / llama.cpp on float32 weights (pretrained, batch 1) | "
            "0.800x [0.7") in page
    assert "| >= 1.00x | not met |" in page
    assert "| tiny | 2 | 40.0 [39" in page  # the main table's tokens/s with its interval
    (latency,) = csv_rows(tmp_path / "decode_speed_latency.csv")
    assert latency["generate s (min / median / max)"] == "0.390 / 0.400 / 0.410"


def test_step_targets_are_judged_by_the_interval_of_the_step_ratio(rows, tmp_path):
    # Steps: (median whole - median prefill) / 7. max_len 400's step equals max_len 40's: 1.00x,
    # its interval inside 1.10x. (The sampling study's step ratios: tests/test_sampling_cost.py.)
    base = rows[0]
    greedy = dict(generate_reps_s=[0.39, 0.40, 0.41, 0.40, 0.40],
                  prefill_reps_s=[0.30, 0.31, 0.30, 0.29, 0.30])
    main = {**base, "config": {**base["config"], "batch_size": 8},
            "metrics": {**base["metrics"], "batch_size": 8, **greedy}}
    lengths = [{**base, "config": {**base["config"], "study": "max_len"},
                "metrics": {**base["metrics"], "study": "max_len", "max_len": S, **greedy}}
               for S in (40, 400)]
    page, _ = render([main, *lengths], tmp_path)
    assert ("| step at the largest max_len / at the smallest (the same live tokens) | 1.00x "
            "[") in page
    assert "| <= 1.10x | met |" in page


def test_the_page_writes_its_main_table_csvs_and_plot(rows, tmp_path):
    page, done = render(rows, tmp_path)
    assert {p.name for p in done.written} == {"decode_speed.md", "decode_speed.csv",
                                              "decode_speed_throughput.csv",
                                              "decode_speed_latency.csv", "decode_speed.png"}
    assert page.startswith("# How fast does dl.generate decode")
    assert "| tiny | 2 |" in page
    # Without the peer the transformers targets are not measured, and the answer says so.
    assert "| tiny batch 2: decodelab / transformers | n/a | >= 1.00x | not measured |" in page
    assert "faster than transformers on 0 of 1 rows" not in page
    assert "faster than transformers: not measured" in page.splitlines()[2]
    header = (tmp_path / "decode_speed_throughput.csv").read_text().splitlines()[0]
    assert header.startswith("preset,params (M),batch,decodelab tok/s,transformers tok/s")


@pytest.fixture(scope="module")
def kept_page(tmp_path_factory):
    """The page rendered from the kept rows of the last full run (results/rows/bench_decode)."""
    return render(report.load_rows(KEPT), tmp_path_factory.mktemp("kept"))


def test_the_committed_page_is_what_its_kept_rows_render(kept_page):
    page, done = kept_page
    assert page == (ROOT / "results" / "decode_speed.md").read_text()
    for path in done.written:
        if path.suffix == ".csv":
            assert path.read_text() == (ROOT / "results" / path.name).read_text(), path.name


def test_every_target_of_the_kept_run_is_judged_in_the_verdict_table(kept_page):
    page, done = kept_page
    claims = [j.claim.text for j in done.judged]
    # Every small, medium and pretrained row and tiny at batch 8 and 32 against its roofline share
    # (0.75 at medium batch 1, 0.85 for the pretrained model at batch 1), every row against
    # transformers, tiny and small against 2x (1.5x at batch 32), every preset at batch 32 against
    # 1.5x, llama.cpp, the cache size (step and whole call), the KV cache, and the sampling
    # study's claims: five settings on each of its 12 rows and history at smollm2-135m batch 8
    # (the "/ greedy step" claims), transformers sampling on 4 rows; the samplers study's XTC,
    # DRY, Mirostat v2, dynamic temperature and contrastive search on its 4 rows (also "/ greedy
    # step"); the weights study's two 16-bit formats on 4 rows.
    assert [sum(text.endswith(suffix) for text in claims) for suffix in (
        ": decodelab / roofline", ": decodelab / transformers", "the 2x target (1.5x at batch 32)",
        "decodelab / transformers at batch 32", "(pretrained, batch 1)", "(the same live tokens)",
        "(prefill and cache set-up included)", "/ greedy step", "over recompute, the lowest row",
        "with float32 weights (greedy)")] == [10, 11, 6, 3, 1, 1, 1, 5 * 12 + 1 + 5 * 4, 1, 8]
    assert sum("both sampling with" in text for text in claims) == 4
    for line in [
            "| small batch 1: decodelab / roofline | 0.915 [0.873, 0.945] | >= 0.500 | met |",
            "| medium batch 1: decodelab / roofline | 0.554 [0.515, 0.566] | >= 0.750 | not met |",
            "| smollm2-135m batch 1: decodelab / roofline | 0.670 [0.613, 0.692] | >= 0.850 | "
            "not met |",
            "| small batch 32: decodelab / transformers | 1.65x [1.40, 1.72] | >= 1.00x | met |",
            "| small batch 32: decodelab / transformers, the 2x target (1.5x at batch 32) | 1.65x "
            "[1.40, 1.72] | >= 1.50x | undecided (about 9 repetitions would be needed) |",
            "| smollm2-135m batch 1: decodelab / llama.cpp on float32 weights (pretrained, batch "
            "1) | 0.666x [0.598, 0.718] | >= 1.00x | not met |",
            "| step at the largest max_len / at the smallest (the same live tokens) | 1.05x "
            "[1.02, 1.07] | <= 1.10x | met |",
            "| whole generate call at the largest max_len / at the smallest (prefill and cache "
            "set-up included) | 1.05x [1.02, 1.07] | <= 1.10x | met |",
            "| medium batch 1: top-p 0.95 step / greedy step | 0.972x [0.922, 1.10] | <= 1.25x | "
            "met |",
            "| small batch 8: decodelab / transformers, both sampling with all four together | "
            "4.81x [3.99, 5.57] | >= 2.00x | met |",
            "| medium batch 1: step with bfloat16 weights / with float32 weights (greedy) | "
            "0.907x [0.837, 0.964] | <= 1.00x | met |",
            "| KV cache speed-up over recompute, the lowest row | 7.96x | >= 10.0x | not met "
            "(point estimate, no interval) |",
            "| smollm2-135m batch 8: XTC 0.5 / 0.1 step / greedy step | 1.07x [0.956, 1.12] | "
            "<= 1.25x | met |",
            "| small batch 8: contrastive search k 4 step / greedy step | 4.91x [4.36, 5.57] | "
            "<= 4.00x | not met |",
            "| small batch 8: all four together step / greedy step | 1.58x [1.11, 2.00] | "
            "<= 1.25x | undecided (about 18 repetitions would be needed) |"]:
        assert line in page
    assert sum(text.endswith("constrained step / free step (regex, greedy)")
               for text in claims) == 2  # smollm2-135m at batch 1 and 8
    assert page.splitlines()[2].startswith(
        "69 of 129 claims met, 26 not met, 34 undecided or not measured")


def test_the_kept_page_follows_the_form_and_keeps_every_column_of_its_csvs(kept_page):
    page, done = kept_page
    lines = page.splitlines()
    assert lines[0].startswith("# How fast") and lines[0].endswith("?")
    assert lines[4] == "| claim | measured [interval] | threshold | verdict |"
    assert ("| preset | batch | decodelab tok/s | decodelab / roofline | decodelab / transformers "
            "| cache speed-up |") in lines
    assert "| tiny | 1 | 10,600 [9,630, 10,900] | 0.902 [0.791, 0.956] | 12.6 [11.4, 13.0] | " \
        "17.7 |" in lines
    assert "`python -m experiments.report --all` (this page)" in page
    headers = {path.name: path.read_text().splitlines()[0].split(",") for path in done.written
               if path.suffix == ".csv"}
    columns = {column for header in headers.values() for column in header}
    # Every column the page's tables had before the page form is still in some CSV.
    assert columns >= {"params (M)", "transformers tok/s", "no-cache tok/s", "roofline tok/s",
                       "sampled tok/s", "compile s", "prefill ms", "bound by",
                       "transformers ms/token", "no-cache ms/token", "MB read per token",
                       "step / own roofline", "live tokens at the end",
                       "step / step at the smallest max_len", "attention ms (share)",
                       "loop bookkeeping ms (share)"}
    assert "e+0" not in page and "e-0" not in page  # plain notation, never 1.03e+04


def test_last_logits_equal_the_full_forward_at_the_last_position(tiny_config):
    graphdef, weights = nnx.split(Transformer(tiny_config, rngs=nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 512, (3, 11)), jnp.int32)
    last = jax.jit(lambda w, t: timing.last_logits(nnx.merge(graphdef, w), t))
    full = jax.jit(lambda w, t: nnx.merge(graphdef, w)(t)[:, -1])
    np.testing.assert_allclose(last(weights, tokens), full(weights, tokens), rtol=1e-5, atol=1e-5)


def test_step_cost_counts_parameters_cache_and_flops_by_hand():
    cfg = ModelConfig(vocab_size=100, d_model=8, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=16)
    # H = 2. Per layer: q 8*4*2, k and v 8*2*2 each, o 4*2*8, SwiGLU 3*8*16.
    per_layer = 64 + 32 + 32 + 64 + 384
    assert roofline.matmul_params(cfg) == 2 * per_layer + 100 * 8
    cost = roofline.step_cost(cfg, batch_size=3, attended=5)
    assert cost.param_bytes == 4 * cfg.num_params()
    assert cost.kv_bytes == 2 * 2 * 3 * 5 * 2 * 2 * 4  # k and v, L, B, S, K, H, float32
    assert cost.flops == 2 * 3 * (2 * per_layer + 800) + 4 * 3 * 2 * 4 * 2 * 5
    assert cost.seconds(bandwidth=cost.bytes, flops_per_s=1e30) == 1.0
    assert cost.seconds(bandwidth=1e30, flops_per_s=cost.flops / 2) == 2.0


def test_decode_seconds_sums_each_steps_roofline():
    cfg = ModelConfig(vocab_size=100, d_model=8, n_layers=2, n_heads=4)
    expected = sum(roofline.step_cost(cfg, 2, 10 + i + 1).seconds(1e9, 1e9) for i in range(4))
    assert roofline.decode_seconds(cfg, 2, prompt_len=10, steps=4, bandwidth=1e9,
                                   flops_per_s=1e9) == pytest.approx(expected, rel=1e-12)


def test_probes_divide_the_bytes_read_and_the_flops_done_by_the_median_time(monkeypatch):
    timed = []

    def half_a_second(fn, *args, repeats):
        timed.append((fn(*args), [a.shape for a in args], repeats))
        return 0.5

    monkeypatch.setattr(roofline, "median_time", half_a_second)
    assert roofline.measure_bandwidth(1 << 20, repeats=3) == 2 * (1 << 20)
    assert roofline.measure_matmul_flops(32, repeats=2) == 2 * 2 * 32**3
    (total, shapes, repeats), (product, matmul_shapes, matmul_repeats) = timed
    assert float(total) == (1 << 20) // 4 and shapes == [((1 << 20) // 4,)] and repeats == 3
    assert product.shape == (32, 32) and matmul_shapes == [(32, 32), (32, 32)]
    assert matmul_repeats == 2


@pytest.mark.parametrize("call, message", [
    (lambda cfg: roofline.step_cost(cfg, 0, 5), "batch_size must be an int >= 1, got 0"),
    (lambda cfg: roofline.step_cost(cfg, 1, 5).seconds(0.0, 1.0),
     "bandwidth must be a finite number > 0, got 0.0"),
    (lambda cfg: roofline.decode_seconds(cfg, 1, 4, 0, 1.0, 1.0), "steps must be an int >= 1"),
    (lambda cfg: roofline.measure_bandwidth(2), "num_bytes must be an int >= 4, got 2"),
])
def test_roofline_helpers_reject_bad_arguments(tiny_config, call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny_config)


def test_the_point_rejects_a_single_new_token(tmp_path):
    with pytest.raises(ValueError, match="config.new_tokens must be an int >= 2, got 1"):
        experiment.run(small_config(new_tokens=1), [{}], bench_decode.benchmark, tmp_path,
                       progress=False)


def test_the_peer_refuses_a_model_that_is_not_llama_shaped(tiny_config):
    requires.importorskip("transformers", reason="the peer is transformers (the test extra)")
    with pytest.raises(ValueError, match="the transformers peer is a Llama model"):
        peers.llama_config(tiny_config.replace(position="alibi"), 64)


@pytest.mark.skipif(not HAS_PEER, reason="needs the peer extra (torch, transformers)")
def test_the_peer_generates_every_token_with_the_same_parameter_count(tiny_config):
    prompts = np.random.default_rng(0).integers(0, 512, (2, 5), dtype=np.int32)
    model = Transformer(tiny_config, rngs=nnx.Rngs(0))
    hf = peers.time_hf_generate(model, prompts, new_tokens=4, repeats=1)
    assert hf["hf_tokens_per_s"] == pytest.approx(2 * 4 / hf["hf_generate_s"], rel=1e-12)
    assert hf["hf_version"].startswith("transformers ")


@pytest.mark.skipif(not HAS_PEER, reason="needs torch and transformers (the peer extra)")
@pytest.mark.parametrize("tie", [True, False])
def test_the_peer_runs_decodelabs_weights(tiny_config, tie):
    import torch
    import transformers

    cfg = tiny_config.replace(tie_embeddings=tie)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    peer = transformers.LlamaForCausalLM(peers.llama_config(cfg, 64)).eval()
    weights = {k: torch.from_numpy(v.copy())
               for k, v in peers.llama_state_dict(model).items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    assert (missing, unexpected) == (["lm_head.weight"] if tie else [], [])
    tokens = np.random.default_rng(0).integers(0, 512, (2, 11), dtype=np.int32)
    with torch.no_grad():
        theirs = peer(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(tokens)), theirs, rtol=0, atol=1e-5)


def test_a_pretrained_preset_sweeps_batch_1_and_8_with_its_own_weights(smollm2_installed):
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config("smollm2-135m"), module.get_sweep("smollm2-135m"))
    assert [p.config.batch_size for p in points] == [1, 8]
    assert {(p.config.preset, p.config.model.pretrained) for p in points} == {
        ("smollm2-135m", "smollm2-135m")}


def test_a_load_up_to_the_benchmarks_own_threads_is_not_read_as_a_shared_machine():
    own = [{"load_avg_1min": 1.9, "threads": 2}, {"load_avg_1min": 1.4, "threads": 2}]
    assert timing.load_reading(own).startswith(
        "1-minute load average up to 1.9 on 2 cores: no more than the benchmark's own 2 threads")
    shared = own + [{"load_avg_1min": 2.6, "threads": 2}]
    assert timing.load_reading(shared).startswith(
        "**The machine was shared during this run** (1-minute load average up to 2.6 on 2 cores")
    # Where rows record the CPU time other processes took, that decides, not the load average.
    assert timing.load_reading(shared, [0.01, 0.08]).startswith(
        "The machine was not shared: other processes kept up to 0.08 of the 2 cores busy")
    assert timing.load_reading(own, [0.01, 0.6]).startswith(
        "**The machine was shared during this run**: other processes kept up to 0.60 of the 2 "
        "cores busy during a point")


@pytest.mark.skipif(not HAS_PEER, reason="needs the peer extra (torch, transformers)")
def test_a_row_keeps_every_peer_repetition_so_the_peer_target_is_judged(tmp_path):
    config = small_config(**{"peer.enabled": True, "peer.repeats": 2, "repeats": 2})
    row = experiment.run(config, [{}], bench_decode.benchmark, tmp_path, progress=False)[0]
    reps = row["metrics"]["hf_generate_reps_s"]
    assert len(reps) == 2 and row["metrics"]["hf_generate_s"] == pytest.approx(np.median(reps))
    page, _ = render([row], tmp_path)
    assert "| tiny batch 2: decodelab / transformers | " in page
    assert "| tiny batch 2: decodelab / transformers | n/a |" not in page  # judged: a value


def test_the_pretrained_speed_rows_time_transformers_and_its_sampling_rows_do_not():
    module = config_module("bench_decode")
    assert module.get_config("smollm2-135m").peer.enabled
    assert module.get_config("tiny").peer.enabled
    assert module.get_config("sampling").peer.enabled
    assert not module.get_config("sampling:smollm2-135m").peer.enabled
