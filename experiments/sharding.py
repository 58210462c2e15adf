"""The sharding page: decode-step traffic planned for real chips, and measured on fake CPU devices.

    python -m experiments.sharding --out=results/sharding.md

Part 1 computes, from the model configs and the published bandwidths in ``CHIPS``
(``decodelab.measure.sharding_plan``), the bytes one decode step moves per layer (weights, KV
cache, tensor-parallel all-reduces) and the batch below which tensor parallel (TP) decoding beats
data parallel (DP) on 8 chips. Part 2 decodes one small model on 8 fake CPU devices of this
machine under each mesh, against one device (``decodelab.measure.mesh_timing``): it shows
correctness and the cost of partitioning on one host, not a speed-up (the 8 "devices" share the
same cores).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import flags
from flax import nnx

from decodelab import experiment
from decodelab.config import ModelConfig
from decodelab.experiment import presets
from decodelab.measure import mesh_timing
from decodelab.measure.sharding_plan import LLAMA3_8B
from decodelab.model import Transformer
from decodelab.report import sharding_page

_OUT = flags.DEFINE_string("out", None, "Write the page here (markdown); print it otherwise.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed generate calls per mesh (median reported).",
                                lower_bound=1)

# Part 2: the model, its prompts and the meshes (data x model; None: one device, no mesh).
MEASURED = ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8,
                       d_ff=768, max_seq_len=128)
PROMPTS, PROMPT_LEN, NEW_TOKENS = 8, 16, 32
MESHES = (None, (8, 1), (1, 8), (2, 4), (4, 2))


def plan_models() -> dict[str, ModelConfig]:
    """The configs the plan covers: ``medium`` (vocab 4096), SmolLM2-135M as its GGUF file
    declares it (when installed), a Llama-3-8B-shaped config."""
    models = {"medium": presets.build_model_config(presets.model_section("medium"), 4096)}
    try:
        from decodelab.convert.from_gguf import gguf_model_config

        models["SmolLM2-135M"] = gguf_model_config(presets.pretrained_path("smollm2-135m"))
    except (ImportError, ValueError):
        pass
    models["Llama-3-8B shape"] = LLAMA3_8B
    return models


def measured(repeats: int) -> list[str]:
    """Part 2: greedy generate of ``MEASURED`` on one device and on each 8-device mesh."""
    model = Transformer(MEASURED, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, MEASURED.vocab_size, PROMPT_LEN).tolist() for _ in range(PROMPTS)]
    timings = mesh_timing.time_meshes(model, prompts, NEW_TOKENS, repeats, MESHES)
    return sharding_page.measured_lines(MEASURED, PROMPTS, PROMPT_LEN, NEW_TOKENS, repeats,
                                        timings, mesh_timing.machine_text())


def main(argv) -> None:
    # Part 2 needs 8 devices: read when JAX's backend starts, which nothing before this does.
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    if jax.device_count() != 8:
        raise RuntimeError(f"part 2 needs 8 CPU devices, JAX started with {jax.device_count()}")
    page = [
        "# Sharded decoding: data and tensor parallel on a device mesh",
        "",
        "Regenerate: `python -m experiments.sharding --out=results/sharding.md` (both parts; "
        "part 2 runs on 8 fake CPU devices, which the program sets up itself).",
        "",
        "No GPU or TPU was available when this page was made: part 1 is computed from "
        "published figures, part 2 ran on CPU only.",
        "",
        *sharding_page.plan_lines(plan_models()),
        *measured(_REPEATS.value),
    ]
    text = "\n".join(page)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    experiment.run_program(main)
