"""The quantization study's sweep and page: the SmolLM2 sweep adds the two llama.cpp rows, the page
renders from rows alone (targets read from the rows, the llama.cpp rows with their KV cache and a
note where the peer was not installed). Synthetic rows; no model is trained."""

import pytest
from study_config import config_module

from decodelab import experiment


@pytest.fixture(scope="module")
def study():
    from experiments import quantization

    return quantization


def _board(kl: float, same: float) -> dict:
    return dict(positions=2048, kl_mean=kl, kl_p99=10 * kl, same_top=same, rms_top_prob=0.01,
                perplexity_reference=20.0, perplexity_candidate=20.0 + 10 * kl,
                perplexity_diff=10 * kl, parameter_bytes=100_000_000, kv_bytes_per_token=1000,
                kl_per_window=[kl] * 16, same_top_per_window=[same] * 16)


def _rows(arg: str | None) -> list[dict]:
    module = config_module("quantization")
    points = experiment.expand(module.get_config(arg), module.get_sweep(arg))
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    rows = []
    for p in points:
        c = p.config
        if c.peer == "llama.cpp":
            metrics = {"label": "llama.cpp (GGUF as stored)",
                       "note": "not run: llama-cpp-python is not installed"}
        elif c.peer:
            metrics = {"label": "llama.cpp (its float32 copy)", **_board(1e-6, 100.0)}
        elif c.self_draft:
            metrics = {"label": "self-draft (int4 g32)", "alpha": 0.9, "speedup_b1": 1.1,
                       "tokens_per_s_b1": 20.0, "parameter_bytes": 100_000_000}
        else:
            label = "f32" if c.weights == "f32" else c.weights
            metrics = {"label": label, **_board(0.001 if c.weights == "int8" else 0.05, 98.0),
                       "tokens_per_s_b1": 20.0, "speedup_b1": 0.9, "tokens_per_s_b8": 80.0,
                       "speedup_b8": 0.8}
        rows.append(dict(experiment="quantization", config_hash=p.config_hash, seed=0,
                         sweep_index=p.index, overrides=p.overrides, config=c.to_dict(),
                         metrics=metrics, start_time="2026-01-01T00:00:00+00:00",
                         wall_time_s=1.0, provenance=provenance))
    return rows


def test_the_pretrained_sweep_adds_the_llama_cpp_rows_after_the_self_draft_row():
    module = config_module("quantization")
    trained, pretrained = module.get_sweep(), module.get_sweep("smollm2-135m")
    assert len(trained) == 25 and len(pretrained) == 27
    assert pretrained[-3:] == [{"self_draft": True}, {"peer": "llama.cpp"},
                               {"peer": "llama.cpp-f32"}]
    assert not any("peer" in point for point in trained)


def test_the_page_shows_the_llama_cpp_rows_beside_the_targets(study, tmp_path):
    written = study.report(_rows("smollm2-135m"), tmp_path)
    page = (tmp_path / "quantization_smollm2-135m.md").read_text()
    assert tmp_path / "quantization_smollm2-135m.csv" in written
    # Judged by the interval over windows (here every window has the same value).
    assert ("- int8 weights: mean KLD 0.001 [0.001, 0.001] (target <= 0.002: met), same top "
            "98 [98, 98]% (target >= 97%: met); speed-up at batch 1 0.90x (target >= 1.5x: "
            "not met (median of the runs)).") in page
    assert ("- llama.cpp (its float32 copy) on the same windows: mean KLD 1e-06 [1e-06, 1e-06] "
            "from decodelab's float32 reference, same top 100 [100, 100]%") in page
    assert ("- int8 weights: mean KLD 0.001 here against 0.00136 for llama.cpp's q8_0 (blocks of "
            "32) on LLaMA-3-8B (0.74x).") in page
    assert ("- llama.cpp (GGUF as stored): not run: llama-cpp-python is not installed."
            in page)
    assert "| llama.cpp (its float32 copy) | f16 (llama.cpp) |" in page


def test_a_llama_cpp_row_needs_a_pretrained_model_before_any_model_is_made(study):
    config = config_module("quantization").get_config()
    config.peer = "llama.cpp"
    with pytest.raises(ValueError, match=r"config.peer='llama.cpp' needs a pretrained model's "
                                         r"GGUF file"):
        study.evaluate(config, None)
    config.peer = "llama"
    with pytest.raises(ValueError, match=r"config.peer must be '' or one of \['llama.cpp', "
                                         r"'llama.cpp-f32'\], got 'llama'"):
        study.evaluate(config, None)


def test_the_speed_target_is_judged_by_the_interval_over_timed_runs(study, tmp_path):
    rows = _rows(None)
    reference = [1.00, 1.10, 0.95, 1.05, 1.02]
    for row in rows:
        if row["metrics"]["label"] == "int8":
            # Candidate runs at half the reference's seconds, run for run: 2x, interval above 1.5.
            row["metrics"].update(reference_reps_s_b1=reference,
                                  reps_s_b1=[s / 2 for s in reference],
                                  reference_reps_s_b8=reference, reps_s_b8=reference)
    study.report(rows, tmp_path)
    page = (tmp_path / "quantization.md").read_text()
    assert "speed-up at batch 1 2.00x [2.00, 2.00] (target >= 1.5x: met)." in page
    assert "| 2 [2, 2] |" in page and "| 1 [1, 1] |" in page
