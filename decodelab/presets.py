"""Named model sizes shared by every experiment config (``tiny``, ``small``, ``draft``, ...).

A preset fixes the architecture except the vocabulary, which comes from the tokenizer. Config files
turn a preset into an ml_collections section holding every ModelConfig field, so any field can be
overridden from the command line (``--config.model.position=alibi``).
"""

from __future__ import annotations

import dataclasses

from ml_collections import config_dict

from decodelab.config import ModelConfig

MODEL_PRESETS: dict[str, dict] = {
    # Unit-test size: compiles in seconds.
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256, max_seq_len=128),
    # The default research model: ~2M parameters at vocab 4096, trains in minutes on 2 CPU cores.
    "small": dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=384, max_seq_len=128),
    # A draft for speculative decoding: several times cheaper per token than `small`.
    "draft": dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=192, max_seq_len=128),
    # ~3.7M parameters at vocab 4096, ~2.7x `small`'s compute per token: a larger model that judges
    # `small`'s text (the sampling study's scorer); 800 steps train in ~6 minutes on 2 CPU cores.
    "scorer": dict(d_model=192, n_layers=6, n_heads=6, n_kv_heads=6, d_ff=576, max_seq_len=128),
    # ~27M parameters at vocab 4096: big enough that decoding is memory-bound (benchmarks).
    "medium": dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=1536, max_seq_len=512),
}

# Fields of ModelConfig that may be None (resolved in __post_init__) and their types, so the
# config section can hold a typed placeholder that the command line can fill.
_OPTIONAL_INT_FIELDS = ("n_kv_heads", "head_dim", "d_ff", "rope_original_max_len")


def model_section(preset: str) -> config_dict.ConfigDict:
    """A ConfigDict with every ModelConfig field except ``vocab_size``, set from ``preset``."""
    if preset not in MODEL_PRESETS:
        raise ValueError(f"preset must be one of {sorted(MODEL_PRESETS)}, got {preset!r}")
    section = config_dict.ConfigDict()
    for field in dataclasses.fields(ModelConfig):
        if field.name == "vocab_size":
            continue
        value = MODEL_PRESETS[preset].get(field.name, field.default)
        if value is None and field.name in _OPTIONAL_INT_FIELDS:
            value = config_dict.placeholder(int)
        setattr(section, field.name, value)
    return section


def build_model_config(section, vocab_size: int) -> ModelConfig:
    """The validated ModelConfig for a config section and a tokenizer's vocabulary size."""
    fields = dict(section.to_dict() if hasattr(section, "to_dict") else section)
    return ModelConfig(vocab_size=vocab_size, **fields)


# The training recipe every study starts from (decodelab.train.TrainConfig fields): the `small`
# preset reaches validation perplexity ~55 in 1500 steps of 16 x 128 tokens on 2 CPU cores.
TRAIN_RECIPE = dict(
    steps=1500, batch_size=16, seq_len=128, learning_rate=3e-3, warmup_steps=100,
    final_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0, b1=0.9, b2=0.95, seed=0,
    checkpoint_every=250, log_every=10,
)


def train_section(**changes) -> config_dict.ConfigDict:
    """A ConfigDict of every TrainConfig field: the shared recipe with ``changes`` applied."""
    unknown = sorted(set(changes) - set(TRAIN_RECIPE))
    if unknown:
        raise ValueError(f"train fields must be among {sorted(TRAIN_RECIPE)}, got {unknown}")
    return config_dict.ConfigDict({**TRAIN_RECIPE, **changes})
