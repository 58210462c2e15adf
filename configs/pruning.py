"""python -m experiments.pruning --config=configs/pruning.py --workdir=runs/pruning

Magnitude and Wanda pruning (unstructured at 10-70%, 2:4 and 4:8), whole head groups and MLP
hidden units removed (25% and 50%), each with and without recovery fine-tuning (the pruned weights
held at zero), plus int8 (W8A8) and int4 g32 weights alone and 25% of the hidden units removed
then W8A8 on top, all judged by `dl.compare` against the float32 model on held-out windows (KL
divergence, same top token, perplexity, bytes) and timed against it (decode tokens/s at batch 1
and 8). The model is `medium` trained on the corpus, the same cache key as the quantization and
speculative studies (copy their `tokenizers` and `models` folders into the workdir to reuse it).
Render the page with `python -m experiments.report --workdir=runs/pruning --out=results`.

On SmolLM2-135M-Instruct (reference: its GGUF file dequantized to float32), without recovery:

    python -m experiments.pruning --config=configs/pruning.py:smollm2-135m \
        --workdir=runs/pruning_smollm2

Time (2 CPU cores): a `medium` point scores 32 windows and times 5 runs at batch 1 and 8 (~1
minute); recovery is RECOVERY_STEPS steps of 8 x 128 tokens (~1.5 s a step), ~1 minute more.
Wanda and Taylor importance calibrate on 16 training windows of 128 tokens.
"""

from ml_collections import config_dict

from decodelab.experiment import product
from decodelab.experiment.presets import (PRETRAINED_MODELS, check_config_arg, model_section,
                                          train_section)

SPARSITIES = (0.1, 0.3, 0.5, 0.7)
METHODS = ("magnitude", "wanda")
N_M = ("2:4", "4:8")
FRACTIONS = (0.25, 0.5)
RECOVERY_STEPS = 40


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
    check_config_arg(arg)
    config = config_dict.ConfigDict()
    # Experiment name: rows of other experiments are refused in the same workdir.
    config.experiment = "pruning"
    config.seed = 0
    # The reference: `medium` trained exactly as in configs/quantization.py (the same cache key).
    config.tokenizer = config_dict.ConfigDict(dict(vocab_size=4096, model_type="bpe"))
    config.model = model_section("medium")
    config.train = train_section(steps=1000, checkpoint_every=250)
    # What is removed: "dense" (nothing: the reference timed against itself), "unstructured",
    # "2:4", "4:8" (`dl.prune`), "heads" (`prune_heads`), "neurons" (`prune_neurons`).
    config.kind = "dense"
    # Unstructured and N:M: "magnitude" or "wanda"; the fraction of weights zeroed (N:M: N / M).
    config.method = "magnitude"
    config.sparsity = 0.5
    # Heads and neurons: the fraction of head groups / hidden units removed, and how they are
    # ranked ("norm" or "taylor").
    config.fraction = 0.25
    config.importance = "taylor"
    # Weights after pruning: "" (float), "int8-w8a8" (int8 weights and activations) or "int4-g32".
    config.weights = ""
    # Recovery fine-tuning steps (0: none), the pruned weights held at zero; its schedule.
    config.recovery_steps = 0
    config.recovery = train_section(steps=RECOVERY_STEPS, batch_size=8, learning_rate=3e-4,
                                    warmup_steps=5, checkpoint_every=RECOVERY_STEPS, seed=1)
    # Scoreboard windows (test plays) and calibration windows (training plays).
    config.num_windows = 32
    config.window_tokens = 128
    config.calibration_windows = 16
    # Decode timing: `new_tokens` greedy tokens after `prompt_tokens`, at each batch size; medians
    # of `repeats` runs interleaved with the dense reference.
    config.batch_sizes = (1, 8)
    config.prompt_tokens = 32
    config.new_tokens = 64
    config.repeats = 5
    if arg is not None:
        config.tokenizer = config_dict.ConfigDict(dict(pretrained=arg))
        config.model = model_section(arg)
        config.num_windows = 16
        config.new_tokens = 32
        config.repeats = 3
    return config


def get_sweep(arg: str | None = None) -> list[dict]:
    """The dense row, then unstructured and N:M per method, heads and neurons, the quantized rows
    and the combined row; every pruned row with and without recovery on the trained model."""
    recover = [0] if arg in PRETRAINED_MODELS else [0, RECOVERY_STEPS]
    points = [{"kind": "dense"}]
    if recover[-1]:  # what the recovery steps alone do to the unpruned model
        points.append({"kind": "dense", "recovery_steps": recover[-1]})
    points += product({"kind": ["unstructured"], "method": list(METHODS),
                       "sparsity": list(SPARSITIES), "recovery_steps": recover})
    points += product({"kind": list(N_M), "method": list(METHODS), "recovery_steps": recover})
    points += product({"kind": ["heads", "neurons"], "fraction": list(FRACTIONS),
                       "recovery_steps": recover})
    points += [{"kind": "dense", "weights": "int8-w8a8"}, {"kind": "dense", "weights": "int4-g32"},
               {"kind": "neurons", "fraction": 0.25, "weights": "int8-w8a8",
                "recovery_steps": recover[-1]}]
    return points
