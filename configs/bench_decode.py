"""python -m experiments.bench_decode --config=configs/bench_decode.py --workdir=runs/bench_decode

Decode speed of `dl.generate` (greedy, EOS ignored: every row generates exactly `new_tokens`) for
the `tiny`, `small` and `medium` presets at batch 1, 8 and 32, each measured against this machine's
roofline, the no-cache baseline and Hugging Face transformers `generate` (on the same weights), all
in the same run. The weights are random (vocabulary 4096): speed does not depend on what the weights
are. A pretrained preset (`presets.PRETRAINED_MODELS`) runs its real weights at batch 1 and 8:

    python -m experiments.bench_decode --config=configs/bench_decode.py:smollm2-135m \
        --workdir=runs/bench_decode

Render the page (both sweeps' rows, if they share the workdir) with
`python -m experiments.report --workdir=runs/bench_decode --out=results`. A quick look:
`--config.new_tokens=16 --config.repeats=1 --config.peer.enabled=False`.
"""

from ml_collections import config_dict

from decodelab.experiment import cross, product
from decodelab.presets import MODEL_PRESETS, PRETRAINED_MODELS, model_section

PRESETS = ("tiny", "small", "medium")
BATCH_SIZES = (1, 8, 32)
# A pretrained model's batch sizes (its weights are 4-16x the medium preset's).
PRETRAINED_BATCH_SIZES = (1, 8)


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "bench_decode"
    # Seed of the random weights and of the random prompt ids.
    config.seed = 0
    # Preset name (a label; the sweep also sets every model field from it, so rows hold them).
    # A pretrained preset's name (the config argument) loads its real weights instead.
    config.preset = arg or "tiny"
    # Model architecture (every ModelConfig field but the vocabulary; for a pretrained preset
    # also `pretrained`, its name).
    config.model = model_section(config.preset)
    # Vocabulary size of a random model (the size of the repo's tokenizer; a pretrained model
    # has its own).
    config.vocab_size = 4096
    # Rows decoded together; all rows share the prompt length.
    config.batch_size = 1
    # Prompt tokens per row (random ids).
    config.prompt_len = 32
    # Output tokens per row (>= 2: the first comes from the prefill, the rest from the loop).
    config.new_tokens = 256
    # Timed runs of each measurement after one warm-up run; medians are reported.
    config.repeats = 5
    config.roofline = config_dict.ConfigDict(dict(
        # Size of the float32 array the bandwidth probe sums (MiB; far beyond the CPU caches).
        bandwidth_mib=512,
        # Side of the square float32 matmul the FLOP/s probe times.
        matmul_n=2048,
        # Timed runs of each probe.
        repeats=5,
    ))
    config.nocache = config_dict.ConfigDict(dict(
        # Sequence lengths at which one full-recompute step is timed (evenly spaced from the
        # prompt to prompt + new_tokens - 1); the time of all steps is interpolated between them.
        lengths=5,
        # Timed runs at each length.
        repeats=3,
    ))
    config.peer = config_dict.ConfigDict(dict(
        # Time transformers' LlamaForCausalLM.generate (needs the `peer` extra; n/a without it).
        enabled=True,
        # Timed runs after a short warm-up call.
        repeats=3,
    ))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    if arg in PRETRAINED_MODELS:
        return product({"batch_size": list(PRETRAINED_BATCH_SIZES)})
    presets = [{"preset": name, **{f"model.{k}": v for k, v in MODEL_PRESETS[name].items()}}
               for name in PRESETS]
    return cross(presets, product({"batch_size": list(BATCH_SIZES)}))
