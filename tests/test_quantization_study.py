"""The quantization study's sweep, labels and pages: the SmolLM2 sweep adds the two llama.cpp rows;
each reference model gets its page in the one form, rendered from rows alone (the targets judged
from the rows, the llama.cpp rows with their KV cache and a note where the peer was not
installed). Synthetic rows; no model is trained."""

import csv

import pytest
from flax import nnx
from study_config import config_module

import decodelab as dl
from decodelab import experiment, report
from decodelab.experiment import compression as candidates


@pytest.fixture(scope="module")
def study():
    from experiments import quantization

    return quantization


def board(kl: float, same: float) -> dict:
    return dict(positions=2048, kl_mean=kl, kl_p99=10 * kl, same_top=same, rms_top_prob=0.01,
                perplexity_reference=20.0, perplexity_candidate=20.0 + 10 * kl,
                perplexity_diff=10 * kl, parameter_bytes=100_000_000, kv_bytes_per_token=1000,
                kl_per_window=[kl] * 16, same_top_per_window=[same] * 16)


def synthetic_rows(arg: str | None) -> list[dict]:
    """A row per point of the sweep of ``arg``: int8 weights at mean KLD 0.001, the others 0.05,
    every speed-up 0.9 at batch 1 (no runs kept); one llama.cpp row not run."""
    module = config_module("quantization")
    points = experiment.expand(module.get_config(arg), module.get_sweep(arg))
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    rows = []
    for p in points:
        c = p.config
        label = candidates.quantization_label(c)
        if c.peer == "llama.cpp":
            metrics = {"label": label, "note": "not run: llama-cpp-python is not installed"}
        elif c.peer:
            metrics = {"label": label, **board(1e-6, 100.0)}
        elif c.self_draft:
            metrics = {"label": label, "alpha": 0.9, "speedup_b1": 1.1, "tokens_per_s_b1": 20.0,
                       "parameter_bytes": 100_000_000}
        else:
            metrics = {"label": label, **board(0.001 if c.weights == "int8" else 0.05, 98.0),
                       "tokens_per_s_b1": 20.0, "speedup_b1": 0.9, "tokens_per_s_b8": 80.0,
                       "speedup_b8": 0.8}
        rows.append(dict(experiment="quantization", config_hash=p.config_hash, seed=0,
                         sweep_index=p.index, overrides=p.overrides, config=c.to_dict(),
                         metrics=metrics, start_time="2026-01-01T00:00:00+00:00",
                         wall_time_s=1.0, provenance=provenance))
    return rows


def render(study, rows, out_dir) -> dict[str, str]:
    """Every page of ``rows``: page name -> its text."""
    return {form.name: report.render(form, rows, out_dir).page.read_text()
            for form in study.forms(rows)}


def test_the_pretrained_sweep_adds_the_llama_cpp_rows_and_their_block_counterparts():
    module = config_module("quantization")
    trained, pretrained = module.get_sweep(), module.get_sweep("smollm2-135m")
    assert len(trained) == 30 and len(pretrained) == 43
    assert pretrained[-14:-8] == [{"self_draft": True}, {"peer": "llama.cpp"},
                                  {"peer": "llama.cpp-f32"}, {"peer": "llama.cpp-q8_0"},
                                  {"peer": "llama.cpp-q4_0"}, {"peer": "llama.cpp-q4_k_m"}]
    assert not any("peer" in point for point in trained)
    points = experiment.expand(module.get_config("smollm2-135m"), pretrained)
    blocks = [p.config for p in points[-8:]]
    assert [candidates.quantization_label(c) for c in blocks] == [
        "int8 g32", "int8 g32 W8A8", "int8 g32 W8A8x2", "int4 g32 GPTQ", "int8 g32 +head",
        "int8 g32 W8A8 +head", "int8 W8A8 +head", "int8 W8A8x2 +head"]
    assert {c.kv_cache for c in blocks} == {"f32"}


def test_each_point_is_labelled_by_its_weights_method_and_activations():
    module = config_module("quantization")
    points = experiment.expand(module.get_config(), module.get_sweep())
    labels = list(dict.fromkeys(candidates.quantization_label(p.config) for p in points))
    assert labels == ["f32", "bfloat16", "float16", "int8", "int4 g128", "int4 g32", "int4 g32 min-max",
                      "int4 g128 GPTQ", "int4 g128 AWQ", "int8 W8A8", "int8 W8A8x2",
                      "self-draft (int4 g32)"]


def test_the_page_shows_the_llama_cpp_rows_beside_the_targets(study, tmp_path):
    page = render(study, synthetic_rows("smollm2-135m"), tmp_path)["quantization_smollm2-135m"]
    assert page.startswith("# How close do int8 and int4 weights and KV caches keep the "
                           "pretrained `smollm2-135m`")
    # Judged by the interval over windows (here every window has the same value).
    assert "| int8 weights: mean KLD | 0.00100 [0.00100, 0.00100] | <= 0.00200 | met |" in page
    # W8A8 is held to the 0.01 the issue asks of it; the block rows are judged on this page.
    assert ("| int8 W8A8 (integer dot): mean KLD | 0.00100 [0.00100, 0.00100] | <= 0.0100 | "
            "met |") in page
    assert ("| int8 g32 weights (as Q8_0): mean KLD | 0.00100 [0.00100, 0.00100] | <= 0.00200 | "
            "met |") in page
    assert "| int4 g32 GPTQ | f32 |" in page
    assert "| int8 weights: same top | 98.0% [98.0, 98.0] | >= 97.0% | met |" in page
    assert ("| int8 weights: speed-up at batch 1 | 0.900x | >= 1.60x | not met (point "
            "estimate, no interval) |") in page
    assert "| int4 g32 weights: same top | 98.0% [98.0, 98.0] | >= 90.0% | met |" in page
    assert ("- llama.cpp (its float32 copy) on the same windows: mean KLD 0.00000100 from "
            "decodelab's float32 reference, same top 100%") in page
    # llama.cpp's own Q8_0 / Q4_0 / Q4_K_M rows replace the published LLaMA-3-8B anchors.
    assert "| llama.cpp Q4_K_M | f16 (llama.cpp) |" in page
    assert "published LLaMA-3-8B" not in page
    trained = render(study, synthetic_rows(None), tmp_path)["quantization"]
    assert "int8 0.00100 against 0.00136 for q8_0 (blocks of 32) (0.735x)" in trained
    assert "- llama.cpp (GGUF as stored): not run: llama-cpp-python is not installed." in page
    assert "| llama.cpp (its float32 copy) | f16 (llama.cpp) |" in page
    assert "| bfloat16 | f32 |" in page and "| float16 | f32 |" in page
    assert "This reference is itself its Q4_1 file dequantized" in page


def test_the_answer_names_each_targets_verdict(study, tmp_path):
    page = render(study, synthetic_rows(None), tmp_path)["quantization"]
    answer = page.splitlines()[2]
    assert answer.startswith("6 of 15 claims met, 7 not met, 2 undecided or not measured; int8 "
                             "weights: met on 2 of 4;")
    # The speed targets for int8: >= 1.6x at batch 1 and >= 1.3x at batch 8.
    assert ("| int8 weights: speed-up at batch 8 | 0.800x | >= 1.30x | not met (point estimate, "
            "no interval) |") in page
    assert "int8 KV cache: mean KLD not met" in answer  # 0.05 against 0.002
    assert "int4 g32 weights" not in page.split("## Method")[0]  # judged on SmolLM2 only


def test_each_reference_model_gets_its_own_page_judged_on_its_rows(study, tmp_path):
    rows = synthetic_rows(None) + synthetic_rows("smollm2-135m")
    pages = render(study, rows, tmp_path)
    assert sorted(pages) == ["quantization", "quantization_smollm2-135m"]
    assert "llama.cpp" not in pages["quantization"].split("## Method")[0]
    assert "| int4 g64 GPTQ | f32 |" in pages["quantization_smollm2-135m"]
    assert "| int4 g128 GPTQ | f32 |" in pages["quantization"]


def test_the_main_table_has_7_columns_and_the_scoreboard_csv_every_figure(study, tmp_path):
    render(study, synthetic_rows(None), tmp_path)
    with open(tmp_path / "quantization.csv", newline="") as f:
        main = next(csv.reader(f))
    with open(tmp_path / "quantization_scoreboard.csv", newline="") as f:
        every = next(csv.reader(f))
    assert [c for c in main if not c.endswith(("_low", "_high"))] == [
        "weights", "KV cache", "param MB", "mean KLD", "same top %", "speed-up b1", "speed-up b8"]
    assert [c for c in every if not c.endswith(("_low", "_high"))] == [
        "weights", "KV cache", "param MB", "KV bytes/token", "mean KLD", "p99 KLD", "same top %",
        "RMS dp", "ppl", "ppl diff", "tok/s b1", "speed-up b1", "tok/s b8", "speed-up b8", "alpha"]


def test_a_llama_cpp_row_needs_a_pretrained_model_before_any_model_is_made(study):
    config = config_module("quantization").get_config()
    config.peer = "llama.cpp"
    with pytest.raises(ValueError, match=r"config.peer='llama.cpp' needs a pretrained model's "
                                         r"GGUF file"):
        study.evaluate(config, None)
    config.peer = "llama"
    with pytest.raises(ValueError, match=r"config.peer must be '' or one of \['llama.cpp', "
                                         r"'llama.cpp-f32', 'llama.cpp-q4_0', 'llama.cpp-q4_k_m', "
                                         r"'llama.cpp-q8_0'\], got 'llama'"):
        study.evaluate(config, None)


def test_the_speed_target_is_judged_by_the_interval_over_timed_runs(study, tmp_path):
    rows = synthetic_rows(None)
    reference = [1.00, 1.10, 0.95, 1.05, 1.02]
    for row in rows:
        if row["metrics"]["label"] == "int8":
            # Candidate runs at half the reference's seconds, run for run: 2x, interval above 1.5.
            row["metrics"].update(reference_reps_s_b1=reference,
                                  reps_s_b1=[s / 2 for s in reference],
                                  reference_reps_s_b8=reference, reps_s_b8=reference)
    page = render(study, rows, tmp_path)["quantization"]
    assert "| int8 weights: speed-up at batch 1 | 2.00x [2.00, 2.00] | >= 1.60x | met |" in page
    assert "| 2.00 [2.00, 2.00] | 1.00 [1.00, 1.00] |" in page  # the main table's speed-ups


def test_int8_and_int4_are_judged_against_llama_cpps_own_quantizations(study, tmp_path):
    rows = synthetic_rows("smollm2-135m")
    runs = [1.00, 1.10, 0.95, 1.05, 1.02]
    for row in rows:
        m, c = row["metrics"], row["config"]
        if c["kv_cache"] != "f32" or c["self_draft"]:
            continue
        if m["label"] == "int8":  # twice llama.cpp Q8_0's seconds: 0.5x its tok/s
            m["reps_s_b1"] = [2 * s for s in runs]
        elif m["label"] == "llama.cpp Q8_0":
            m["reps_s_b1"] = runs
        elif m["label"] == "int4 g32":  # Q4_0's seconds
            m.update(reps_s_b1=runs)
        elif m["label"] == "int4 g32 GPTQ":  # 90% same top, 1.1x Q4_0's KL
            m.update(same_top_per_window=[90.0] * 16,
                     kl_per_window=[0.011 * (1 + i % 2) for i in range(16)])
        elif m["label"] == "llama.cpp Q4_0":
            m.update(reps_s_b1=runs, same_top_per_window=[92.0 - 2 * (i % 2) for i in range(16)],
                     kl_per_window=[0.01 * (1 + i % 2) for i in range(16)])
    page = render(study, rows, tmp_path)["quantization_smollm2-135m"]
    # Each program's runs resampled on their own: the intervals are not points.
    assert ("| int8 weights: tok/s at batch 1 / llama.cpp Q8_0's | 0.500x [0.455, 0.550] | "
            ">= 0.800x | not met |") in page
    assert ("| int4 g32 weights: tok/s at batch 1 / llama.cpp Q4_0's | 1.00x [0.909, 1.10] | "
            ">= 0.800x | met |") in page
    assert ("| int4 g32 GPTQ weights: same top minus llama.cpp Q4_0's | -1.00% [-1.50, -0.500] "
            "| >= 0% | not met |") in page
    assert ("| int4 g32 GPTQ weights: mean KLD / llama.cpp Q4_0's | 1.10x [1.10, 1.10] | "
            "<= 1.20x | met |") in page


def test_gptq_and_awq_are_judged_against_round_to_nearest_window_by_window(study, tmp_path):
    rows = synthetic_rows(None)
    for row in rows:
        c = row["config"]
        if c["kv_cache"] == "f32" and row["metrics"]["label"] == "int4 g128 GPTQ":
            row["metrics"]["kl_per_window"] = [0.05 - 0.01 * (i % 2) for i in range(16)]
        if c["kv_cache"] == "f32" and row["metrics"]["label"] == "int4 g128 AWQ":
            row["metrics"]["kl_per_window"] = [0.05 + 0.01 * (i % 2) for i in range(16)]
    page = render(study, rows, tmp_path)["quantization"]
    lines = [line for line in page.splitlines()
             if line.startswith("| int4 at the larger group size")]
    assert lines[0].startswith("| int4 at the larger group size, mean KLD minus round to "
                               "nearest's: GPTQ | -0.00500 [")
    assert lines[0].endswith("| <= 0 | met |")
    assert lines[1].endswith("| <= 0 | not met |")


def test_a_16_bit_weight_row_is_the_reference_cast_and_read_through_a_float32_cache(tiny_config):
    module = config_module("quantization")
    points = experiment.expand(module.get_config(), module.get_sweep())
    sixteen = [p.config for p in points if p.config.weights in ("bfloat16", "float16")]
    assert [(c.weights, c.kv_cache) for c in sixteen] == [("bfloat16", "f32"), ("float16", "f32")]
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    for c in sixteen:
        candidate = candidates.quantized(c, model, tokenizer=None)
        assert candidate.config == model.config.replace(param_dtype=c.weights)
