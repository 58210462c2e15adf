"""llama.cpp's own conversions of a GGUF file as scoreboard peers (``measure.llama_cpp.convert``,
``measure.compression.llama_cpp_scoreboard``): the conversion's arguments, and on SmolLM2, where
the ``llamacpp`` extra is installed (never in CI: it compiles llama.cpp), its Q8_0 scored against
decodelab's float32 reference and timed."""

from __future__ import annotations

import numpy as np
import pytest

from decodelab.experiment import artefacts, presets
from decodelab.measure import compression, llama_cpp


def test_a_conversion_names_one_of_llama_cpps_file_types(tmp_path):
    with pytest.raises(ValueError, match=r"ftype must be one of \['f32', 'q4_0', 'q4_k_m', "
                                         r"'q8_0'\], got 'q3_k'"):
        llama_cpp.convert(tmp_path / "in.gguf", tmp_path / "out.gguf", "q3_k")


@pytest.mark.slow
def test_llama_cpps_q8_0_of_smollm2_is_scored_against_the_reference_and_timed(
        smollm2_installed, tmp_path):
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (compiles llama.cpp)")
    model, _ = artefacts.pretrained_model(presets.model_section(smollm2_installed))
    source = presets.pretrained_path(smollm2_installed)
    q8 = llama_cpp.convert(source, tmp_path / "q8_0.gguf", "q8_0")
    f32 = tmp_path / "q8_0-f32.gguf"  # the float32 copy Q8_0 was made from
    assert f32.is_file() and 3.5 < f32.stat().st_size / q8.stat().st_size < 4.0
    windows = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 17))
    row = compression.llama_cpp_scoreboard(model, source, windows, windows[0, :8].tolist(), 4, 2,
                                           ftype="q8_0")
    assert row["kl_mean"] < 0.05 and row["same_top"] > 80.0  # 8 bits per weight, blocks of 32
    assert row["parameter_bytes"] == llama_cpp.gguf_tensor_bytes(q8)
    assert len(row["reps_s_b1"]) == 2 and row["tokens_per_s_b1"] > 0
