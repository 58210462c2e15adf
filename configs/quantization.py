"""python -m experiments.quantization --config=configs/quantization.py --workdir=runs/quantization

Weights stored quantized (int8; int4 in groups of 128 and of 32, absmax and min-max; GPTQ and AWQ
int4 g128; int8 with int8 activations, W8A8, and with activations as two int8 terms, W8A8x2),
each crossed with a float32, int8 or int4 KV cache, judged by `dl.compare` against the float32 model on held-out windows (KL divergence, same top
token, perplexity, bytes) and timed against it (decode tokens/s at batch 1 and 8); plus one row of
speculative decoding that drafts with the int4 g32 copy of the model itself. The model is `medium`
trained on the corpus.
Render the page with `python -m experiments.report --workdir=runs/quantization --out=results`.

On SmolLM2-135M-Instruct (reference: its GGUF file dequantized to float32), plus rows of
llama.cpp's logits and decode speed from the same file as stored and from llama.cpp's own float32,
Q8_0, Q4_0 and Q4_K_M conversions of it (where the `llamacpp` extra is installed), and rows of
decodelab's counterparts of those block formats (int8 and GPTQ int4 in blocks of 32), and int8
rows with the head (the tied embedding table) quantized too, as llama.cpp's files store it:

    python -m experiments.quantization --config=configs/quantization.py:smollm2-135m \
        --workdir=runs/quantization_smollm2
    python -m experiments.report --workdir=runs/quantization_smollm2 --out=results

SmolLM2's width (576) is not a multiple of 128, so its "g128" rows use groups of 64.

A quick look (tiny model, a few training steps, one point):
`--config.model.d_model=64 --config.model.n_layers=2 --config.model.n_heads=4
--config.model.n_kv_heads=2 --config.model.d_ff=256 --config.model.max_seq_len=128
--config.train.steps=20 --config.train.warmup_steps=5 --config.num_windows=2 --config.new_tokens=8
--config.repeats=2 --sweep_shard=0/25`.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import (PRETRAINED_MODELS, check_config_arg, model_section,
                                          train_section)

# (weights, group_size (0: one scale per output channel), scheme, method, activations ("": float,
# "int8": W8A8)): the weight rows. bfloat16 and float16 store the float32 weights cast (a 16-bit
# row is read through the float32 KV cache only: its KV cache rows would repeat the f32 row's).
WEIGHT_ROWS = (
    ("f32", 0, "absmax", "rtn", ""),
    ("bfloat16", 0, "absmax", "rtn", ""),
    ("float16", 0, "absmax", "rtn", ""),
    ("int8", 0, "absmax", "rtn", ""),
    ("int4", 128, "absmax", "rtn", ""),
    ("int4", 32, "absmax", "rtn", ""),
    ("int4", 32, "minmax", "rtn", ""),
    ("int4", 128, "absmax", "gptq", ""),
    ("int4", 128, "absmax", "awq", ""),
    ("int8", 0, "absmax", "rtn", "int8"),
    ("int8", 0, "absmax", "rtn", "int8x2"),
)
# The counterparts of llama.cpp's block formats, on a pretrained model's page (where llama.cpp's
# own quantizations of the same file are), read through the float32 KV cache: int8 in blocks of
# 32 as Q8_0, with float inputs, with inputs rounded to int8 in the same blocks (as Q8_0's integer
# dot) and as two int8 terms; int4 in blocks of 32 calibrated by GPTQ, set against Q4_0. The last
# element: the tied embedding table (the head) quantized too, as llama.cpp's Q8_0 stores it.
BLOCK_ROWS = (
    ("int8", 32, "absmax", "rtn", "", False),
    ("int8", 32, "absmax", "rtn", "int8", False),
    ("int8", 32, "absmax", "rtn", "int8x2", False),
    ("int4", 32, "absmax", "gptq", "", False),
    ("int8", 32, "absmax", "rtn", "", True),
    ("int8", 32, "absmax", "rtn", "int8", True),
    ("int8", 0, "absmax", "rtn", "int8", True),
    ("int8", 0, "absmax", "rtn", "int8x2", True),
)
KV_CACHES = ("f32", "int8", "int4")
SIXTEEN_BITS = ("bfloat16", "float16")
PEERS = ("llama.cpp", "llama.cpp-f32", "llama.cpp-q8_0", "llama.cpp-q4_0", "llama.cpp-q4_k_m")


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    check_config_arg(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "quantization"
    # Seed of the decoding requests (greedy: it only names the streams).
    config.seed = 0
    # Tokenizer trained on the training plays.
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    # The reference model: `medium` trained with the shared recipe.
    config.model = model_section("medium")
    config.train = train_section(steps=1000, checkpoint_every=250)
    # Weights: "f32" (the reference itself), "int8" or "int4".
    config.weights = "f32"
    # Input channels per scale (0: one scale per output channel).
    config.group_size = 0
    # "absmax" (symmetric) or "minmax" (asymmetric, with zero points).
    config.scheme = "absmax"
    # "rtn" (round to nearest), "gptq" or "awq" (calibrated on training windows).
    config.method = "rtn"
    # "" (float inputs) or "int8": each token's input to a projection rounded to int8 and an
    # integer dot (W8A8, `dl.quantize(activations="int8")`); "int8x2": the input and its
    # rounding's remainder as two int8 terms of one integer dot (W8A8x2).
    config.activations = ""
    # True: the head (the tied embedding table, or the output projection) quantized too, as the
    # block projections are (`dl.quantize(embeddings=True)`).
    config.embeddings = False
    # KV cache of the candidate: "f32", "int8" or "int4".
    config.kv_cache = "f32"
    # True: the speculative row (the reference drafting with its own int4 g32 copy).
    config.self_draft = False
    # "" (a decodelab candidate) or llama.cpp reading the pretrained model's GGUF file (the
    # `llamacpp` extra): "llama.cpp" (the file as stored), "llama.cpp-f32" (llama.cpp's own
    # float32 copy of it, the reference's weights exactly), or "llama.cpp-q8_0", "-q4_0",
    # "-q4_k_m" (llama.cpp's quantizer run on that float32 copy): cross-implementation rows.
    config.peer = ""
    # Proposals per round of the speculative row.
    config.gamma = 4
    # Scoreboard windows: evenly spaced windows of `window_tokens` + 1 tokens of the test plays.
    config.num_windows = 32
    config.window_tokens = 128
    # GPTQ / AWQ calibration: windows of the training plays.
    config.calibration_windows = 16
    # Decode timing: prompts of `prompt_tokens` test-play tokens, `new_tokens` greedy tokens each,
    # at each batch size; medians of `repeats` interleaved runs of reference and candidate.
    config.batch_sizes = (1, 8)
    config.prompt_tokens = 32
    config.new_tokens = 64
    config.repeats = 5
    # Fields added after rows were kept, at the value those rows ran with: left out of the
    # config hash at that value, so the kept rows keep their points.
    config.added_fields = config_dict.ConfigDict(dict(embeddings=False))
    if arg is not None:
        # The pretrained model is the reference (its training section is not used).
        config.tokenizer = config_dict.ConfigDict(dict(pretrained=arg))
        config.model = model_section(arg)
        config.num_windows = 16
        config.new_tokens = 32
        config.repeats = 3
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    """Each weight row with each KV cache, then the self-draft speculative row (and, for a
    pretrained model, the llama.cpp rows and the block rows, ``BLOCK_ROWS``)."""
    big_group = 64 if arg in PRETRAINED_MODELS else 128
    points = []
    for weights, group, scheme, method, activations in WEIGHT_ROWS:
        group = big_group if group == 128 else group
        extra = {"activations": [activations]} if activations else {}
        kv = ["f32"] if weights in SIXTEEN_BITS else list(KV_CACHES)
        points += product({"weights": [weights], "group_size": [group], "scheme": [scheme],
                           "method": [method], "kv_cache": kv, **extra})
    pretrained = arg in PRETRAINED_MODELS
    peers = [{"peer": p} for p in PEERS] if pretrained else []
    blocks = [{"weights": weights, "group_size": group, "scheme": scheme, "method": method,
               "kv_cache": "f32", **({"activations": activations} if activations else {}),
               **({"embeddings": True} if embeddings else {})}
              for weights, group, scheme, method, activations, embeddings in BLOCK_ROWS
              if pretrained]
    return points + [{"self_draft": True}] + peers + blocks
