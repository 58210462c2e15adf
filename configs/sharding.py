"""python -m experiments.sharding --config=configs/sharding.py --workdir=runs/sharding

Sharded decoding, two parts. `plan` points compute, from a model config and the published figures
of 8-chip machines (`decodelab/measure/sharding_plan.py`: `CHIPS`, the all-reduce latency), the
bytes one decode step moves per layer and the time tensor parallel (TP) and data parallel (DP) take
over 8 chips, one point per (`chip`, `plan_model`, `batch`); nothing is measured. `measure` points
time greedy `generate` of one small model with random weights on 8 fake CPU devices of this
machine, one point per `mesh` (data x model, or `none`: one device without a mesh): `repeats`
timed calls after a first (compiling) one. The program asks XLA for the 8 devices itself before
JAX starts. Render the page with `python -m experiments.report --workdir=runs/sharding
--out=results` (`results/sharding.md`). `:tiny` is a seconds-cheap variant for tests.
"""

from ml_collections import config_dict

from decodelab.experiment import product

CHIPS = ("8 x H100 SXM (NVLink 4)", "TPU v5e-8 (ICI)")  # names in sharding_plan.CHIPS
PLAN_MODELS = ("medium", "smollm2-135m", "llama3-8b-shape")
BATCHES = (1, 8, 64, 256, 2048)  # total rows over the 8 chips
MESHES = ("none", "8x1", "1x8", "2x4", "4x2")  # data x model; none: one device, no mesh


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    tiny = arg == "tiny"
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "sharding"
    # Seed of the measured model's random weights and of its prompts.
    config.seed = 0
    # Which part: plan (computed from published figures) | measure (timed on fake CPU devices).
    config.part = "measure"
    # Plan: the 8-chip machine, the model (`medium` at vocab 4096, SmolLM2-135M as its GGUF
    # file declares it, a Llama-3-8B-shaped config) and the total batch over the 8 chips.
    config.chip = CHIPS[0]
    config.plan_model = "llama3-8b-shape"
    config.batch = 1
    # Measure: the mesh (data x model over the fake devices, or none) and the timed calls.
    config.mesh = "none"
    config.repeats = 1 if tiny else 3
    # The measured model (random weights; 8 query heads split over every model axis, MHA).
    config.vocab_size = 256 if tiny else 4096
    config.model = config_dict.ConfigDict(dict(
        d_model=64 if tiny else 256, n_layers=2 if tiny else 4, n_heads=8, n_kv_heads=8,
        d_ff=128 if tiny else 768, max_seq_len=128))
    # Greedy generate of `prompts` random prompts of `prompt_len` tokens, `new_tokens` each.
    config.prompts = 8
    config.prompt_len = 4 if tiny else 16
    config.new_tokens = 4 if tiny else 32
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    tiny = arg == "tiny"
    plan = product({"part": ["plan"], "chip": list(CHIPS),
                    "plan_model": ["medium", "llama3-8b-shape"] if tiny else list(PLAN_MODELS),
                    "batch": [1, 2048] if tiny else list(BATCHES)})
    return plan + product({"part": ["measure"], "mesh": list(MESHES)})
