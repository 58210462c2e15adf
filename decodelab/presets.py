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
