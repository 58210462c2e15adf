"""python -m experiments.bench_decode --config=configs/bench_decode.py --workdir=runs/bench_decode

Decode speed of `dl.generate` (EOS ignored: every row generates exactly `new_tokens`), greedy and
sampled (temperature 0.8, top-p 0.95), for the `tiny`, `small` and `medium` presets at batch 1, 8
and 32, each measured against this machine's roofline, the no-cache baseline and Hugging Face
transformers `generate` (on the same weights), all in the same run. The weights are random
(vocabulary 4096): speed does not depend on what the weights are. A pretrained preset
(`presets.PRETRAINED_MODELS`) runs its real weights at batch 1 and 8:

    python -m experiments.bench_decode --config=configs/bench_decode.py:smollm2-135m \
        --workdir=runs/bench_decode

On a pretrained preset batch 1 is also timed against llama.cpp (`llama-cpp-python`, the
`llamacpp` extra) on the same GGUF file, as stored and converted by llama.cpp to float32.

Two more sweeps write their own rows (`study`) into the same workdir:

    python -m experiments.bench_decode --config=configs/bench_decode.py:max_len \
        --workdir=runs/bench_decode
    python -m experiments.bench_decode --config=configs/bench_decode.py:breakdown \
        --workdir=runs/bench_decode

    python -m experiments.bench_decode --config=configs/bench_decode.py:sampling \
        --workdir=runs/bench_decode
    python -m experiments.bench_decode --config=configs/bench_decode.py:sampling:smollm2-135m \
        --workdir=runs/bench_decode

    python -m experiments.bench_decode --config=configs/bench_decode.py:constrained \
        --workdir=runs/bench_decode

    python -m experiments.bench_decode --config=configs/bench_decode.py:samplers \
        --workdir=runs/bench_decode
    python -m experiments.bench_decode --config=configs/bench_decode.py:samplers:smollm2-135m \
        --workdir=runs/bench_decode

    python -m experiments.bench_decode --config=configs/bench_decode.py:weights \
        --workdir=runs/bench_decode
    python -m experiments.bench_decode --config=configs/bench_decode.py:weights:smollm2-135m \
        --workdir=runs/bench_decode

`constrained`: what a constrained decode step costs beside a free one (issue 33), SmolLM2-135M
(its tokenizer builds the automaton) at batch 1 and 8: greedy, EOS banned, 64 new tokens,
`CONSTRAINED_PATTERN`, in which every state accepts and most tokens are allowed.
`sampling`: what sampling costs beside greedy, `tiny`, `small`, `medium` (and with
`sampling:smollm2-135m` the pretrained model) at batch 1, 8 and 32: the greedy step and the step
under each setting of `decodelab/measure/sampling_cost.py` (`SETTINGS`), on the same rows, and
transformers sampling with the same processors.
`samplers`: what llama.cpp's samplers (XTC, DRY, Mirostat v2, dynamic temperature) and
contrastive search (alpha 0.6, k 4) cost beside greedy, `small` (and with
`samplers:smollm2-135m` the pretrained model) at batch 1 and 8: the greedy step and the step of
each (`SAMPLERS`, `CONTRASTIVE` in `decodelab/measure/sampling_cost.py`) on the same rows.
`weights`: what storing the weights in 16 bits costs beside float32 (`dl.quantize(model,
weights="bfloat16")` and "float16"), `medium` (and with `weights:smollm2-135m` the pretrained
model) at batch 1 and 8: greedy, the float32 model and its 16-bit copies on the same rows
(`decodelab/measure/weight_cost.py`).
`max_len`: `small` at batch 8 with caches of 288 (the default, prompt + new tokens), 1024 and 4096
slots, the same live tokens: a step should cost what the live rows hold, not the cache's size.
Each larger cache is timed beside 288 slots, the repetitions interleaved (`timing.time_capacity`).
`breakdown`: `small` at batch 1, 8 and 32, each step split into attention, MLP and projections,
sampling and loop bookkeeping by ablation (`decodelab/measure/ablation.py`, `ABLATIONS`).

On a GPU, give the sweeps their own workdir (`--workdir=runs/bench_decode_gpu`): a page compares
one backend's rows, and GPU rows render as `decode_speed_gpu.md` beside the CPU page, with the
transformers peer on CUDA.

Render the page (every sweep's rows in the workdir) with
`python -m experiments.report --workdir=runs/bench_decode --out=results`. A quick look:
`--config.new_tokens=16 --config.repeats=1 --config.peer.enabled=False`.
"""

from ml_collections import config_dict

from decodelab.experiment import cross, product
from decodelab.experiment.presets import MODEL_PRESETS, PRETRAINED_MODELS, model_section

PRESETS = ("tiny", "small", "medium")
BATCH_SIZES = (1, 8, 32)
# A pretrained model's batch sizes (its weights are 4-16x the medium preset's).
PRETRAINED_BATCH_SIZES = (1, 8)
# Cache slots of the max_len sweep (288 = prompt_len + new_tokens, the default) on small, batch 8.
MAX_LENS = (288, 1024, 4096)
# Timed runs of each cache size and of the smallest beside it (interleaved): 128 left the
# step ratio at 4096 undecided against 1.10x (1.04x [0.980, 1.12], about 225 needed).
MAX_LEN_REPEATS = 256
# What the config argument names besides a preset: a sweep with its own rows.
STUDIES = ("max_len", "breakdown", "sampling", "constrained", "weights", "samplers")
# The weights study's preset (a random model) and batch sizes.
WEIGHTS_PRESET, WEIGHTS_BATCH_SIZES = "medium", (1, 8)
# The constrained study's pattern and model: text of letters, spaces and punctuation.
CONSTRAINED_PATTERN, CONSTRAINED_MODEL = r"[A-Za-z ,.]*", "smollm2-135m"
# The sampling study's output tokens per row and timed runs (a pretrained model's: fewer; 5 and
# 3 left 24 of its 66 claims undecided).
SAMPLING_NEW_TOKENS, SAMPLING_REPEATS = {"random": 128, "pretrained": 32}, {"random": 9,
                                                                            "pretrained": 5}
# The samplers study's (llama.cpp's samplers, contrastive search): enough repetitions to decide
# a ratio within 25% (small's 0.25 ms step left 9 repetitions undecided on every small row).
SAMPLERS_NEW_TOKENS, SAMPLERS_REPEATS = {"random": 128, "pretrained": 64}, {"random": 31,
                                                                            "pretrained": 7}


def _study(arg: str | None) -> tuple[str, str]:
    """(study, preset) of the config argument: a preset, a study, or ``sampling:<preset>``."""
    head, _, tail = (arg or "").partition(":")
    if head not in STUDIES:
        return "speed", arg or "tiny"
    if head == "constrained" and not tail:
        return head, CONSTRAINED_MODEL
    taking = ("sampling", "constrained", "weights", "samplers")
    if tail and (head not in taking or tail not in PRETRAINED_MODELS):
        raise ValueError(f"config argument {arg!r}: only {', '.join(taking)} take a "
                         f"pretrained preset ({sorted(PRETRAINED_MODELS)})")
    return head, tail or {"sampling": "tiny", "weights": WEIGHTS_PRESET}.get(head, "small")


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    study, preset = _study(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "bench_decode"
    # Which table of the page the rows belong to: "speed" (the main sweep) or one of STUDIES
    # (the sweeps named by the config argument).
    config.study = study
    # Seed of the random weights and of the random prompt ids.
    config.seed = 0
    # Preset name (a label; the sweep also sets every model field from it, so rows hold them).
    # A pretrained preset's name (the config argument) loads its real weights instead.
    config.preset = preset
    # Model architecture (every ModelConfig field but the vocabulary; for a pretrained preset
    # also `pretrained`, its name).
    config.model = model_section(config.preset)
    # Vocabulary size of a random model (the size of the repo's tokenizer; a pretrained model
    # has its own).
    config.vocab_size = 4096
    weights = "pretrained" if preset in PRETRAINED_MODELS else "random"
    # Rows decoded together; all rows share the prompt length.
    config.batch_size = 1
    # Prompt tokens per row (random ids).
    config.prompt_len = 32
    # Output tokens per row (>= 2: the first comes from the prefill, the rest from the loop).
    config.new_tokens = {"sampling": SAMPLING_NEW_TOKENS[weights], "constrained": 64,
                         "samplers": SAMPLERS_NEW_TOKENS[weights],
                         "weights": 128}.get(study, 256)
    # Cache slots per row; 0: prompt_len + new_tokens, the least that holds every row.
    config.max_len = 0
    config.sampled = config_dict.ConfigDict(dict(
        # Also time sampled decoding (the same rows, every row sampling) beside greedy.
        enabled=True,
        # Its sampling parameters: temperature and nucleus (top-p) mass.
        temperature=0.8,
        top_p=0.95,
    ))
    config.breakdown = config_dict.ConfigDict(dict(
        # Split the step time by ablation (greedy, and sampled if enabled): each ablation level
        # is a whole timed generate with one more part of the step removed.
        enabled=study == "breakdown",
        # Timed runs of each ablation level after a warm-up run.
        repeats=3,
    ))
    # Timed runs of each measurement after one warm-up run; medians are reported. The max_len
    # study's claims are ratios within 10%: it takes enough runs to decide them.
    config.repeats = {"sampling": SAMPLING_REPEATS[weights], "constrained": 20,
                      "samplers": SAMPLERS_REPEATS[weights],
                      "max_len": MAX_LEN_REPEATS}.get(study, 5)
    # The constrained study's pattern (a regex).
    config.pattern = CONSTRAINED_PATTERN
    config.roofline = config_dict.ConfigDict(dict(
        # Size of the float32 array the bandwidth probe sums (MiB; far beyond the CPU caches).
        bandwidth_mib=512,
        # Side of the square float32 matmul the FLOP/s probe times.
        matmul_n=2048,
        # Timed runs of each probe.
        repeats=5,
    ))
    config.nocache = config_dict.ConfigDict(dict(
        # Time the no-cache baseline (n/a when off; the max_len and breakdown sweeps skip it).
        enabled=study == "speed",
        # Sequence lengths at which one full-recompute step is timed (evenly spaced from the
        # prompt to prompt + new_tokens - 1); the time of all steps is interpolated between them.
        lengths=5,
        # Timed runs at each length.
        repeats=3,
    ))
    config.peer = config_dict.ConfigDict(dict(
        # Time transformers' LlamaForCausalLM.generate (needs the `peer` extra; n/a without it;
        # the max_len and breakdown sweeps skip it; the sampling study times it sampling, on
        # the random-weight presets only).
        enabled=study == "speed" or (study == "sampling" and weights == "random"),
        # Timed runs after a short warm-up call.
        repeats=3,
    ))
    config.llama = config_dict.ConfigDict(dict(
        # Time llama.cpp on a pretrained preset's GGUF file at batch 1, as stored and converted
        # to float32 by llama.cpp (needs the `llamacpp` extra; n/a without it).
        enabled=study == "speed" and preset in PRETRAINED_MODELS,
        # Timed runs after a warm-up call.
        repeats=3,
        # llama.cpp's extra weight buffer types (repacked and AMX kernels). Off: its plain
        # AVX2 / AVX-512 kernels, which run on every x86 machine (its AMX kernels stop with an
        # illegal instruction where the kernel grants no AMX state, as in some virtual machines).
        extra_buffers=False,
    ))
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    study, preset = _study(arg)
    if study == "weights":
        return product({"batch_size": list(WEIGHTS_BATCH_SIZES)})
    if preset in PRETRAINED_MODELS:
        sizes = BATCH_SIZES if study == "sampling" else PRETRAINED_BATCH_SIZES
        return product({"batch_size": list(sizes)})
    small = {"preset": "small", **{f"model.{k}": v for k, v in MODEL_PRESETS["small"].items()}}
    if study == "samplers":
        return cross([small], product({"batch_size": list(PRETRAINED_BATCH_SIZES)}))
    if arg == "max_len":
        return cross([small], product({"batch_size": [8], "max_len": list(MAX_LENS)}))
    if arg == "breakdown":
        return cross([small], product({"batch_size": list(BATCH_SIZES)}))
    presets = [{"preset": name, **{f"model.{k}": v for k, v in MODEL_PRESETS[name].items()}}
               for name in PRESETS]
    return cross(presets, product({"batch_size": list(BATCH_SIZES)}))
