"""ModelConfig: every architectural choice of a decodelab Transformer, validated in one place.

The config is a frozen dataclass so it can be hashed, stored next to a checkpoint and compared.
Optional fields left as ``None`` resolve to their conventional defaults in ``__post_init__``
(``n_kv_heads = n_heads``, ``head_dim = d_model // n_heads``, ``d_ff = 4 * d_model``), so a config
read back from a checkpoint is always fully explicit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from decodelab.checks import check_bool, check_int, check_number, check_one_of

# The names a config may use; each registry in the model package is keyed by exactly these names
# (a test checks the two agree), so the config never imports the model.
POSITIONS = ("learned", "sinusoidal", "t5", "alibi", "rope", "nope")
ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "dynamic", "llama3")
NORMS = ("rms", "layer")
MLPS = ("swiglu", "gelu")
DTYPES = ("float32", "bfloat16")
PARAM_DTYPES = ("float32", "bfloat16", "float16")
# Fields added after trained models and result rows were keyed: those that only imported
# checkpoints set (they came with the GGUF / Hugging Face loaders) and the parameters' storage
# dtype. At their defaults they are left out of cache keys (``key_dict``) and of the size presets'
# config sections, so what was made before these fields existed keeps its keys.
CHECKPOINT_FIELDS = ("attention_bias", "mlp_bias", "llama3_low_freq_factor",
                     "llama3_high_freq_factor", "param_dtype")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only Transformer. Dimension letters follow DESIGN.md §3."""

    # V: vocabulary size; token ids are in [0, V).
    vocab_size: int
    # D: model (residual stream) width.
    d_model: int
    # L: number of Transformer blocks.
    n_layers: int
    # N: query heads.
    n_heads: int
    # K: key/value heads (N for multi-head, 1 for multi-query, between for grouped-query).
    n_kv_heads: int | None = None
    # H: per-head width; defaults to D // N.
    head_dim: int | None = None
    # F: MLP hidden width; defaults to 4 * D.
    d_ff: int | None = None
    # Training context length; the `learned` table has exactly this many rows.
    max_seq_len: int = 256
    # Position encoding, one of POSITIONS.
    position: str = "rope"
    # RoPE base frequency.
    rope_theta: float = 10000.0
    # Context-extension rule applied to RoPE frequencies, one of ROPE_SCALINGS.
    rope_scaling: str = "none"
    # Extension factor s for every scaling but none (1.0 means no change).
    rope_scaling_factor: float = 1.0
    # Context length the RoPE model was trained at (YaRN's correction range, Llama 3's wavelength
    # bounds, the length past which dynamic NTK starts scaling); defaults to max_seq_len.
    rope_original_max_len: int | None = None
    # YaRN ramp bounds in rotations (Peng et al. 2023 defaults).
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # Llama 3 scaling: wavelengths above original / low are interpolated by s, those below
    # original / high are kept, a smooth blend between (Meta's Llama 3.1 defaults).
    llama3_low_freq_factor: float = 1.0
    llama3_high_freq_factor: float = 4.0
    # T5 relative attention: number of buckets and the distance beyond which all share one bucket.
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    # Normalisation before each sub-block and at the end, one of NORMS.
    norm: str = "rms"
    norm_eps: float = 1e-6
    # MLP variant, one of MLPS.
    mlp: str = "swiglu"
    # Biases on the attention projections q, k, v, o (GPT-2) and on the MLP projections.
    attention_bias: bool = False
    mlp_bias: bool = False
    # Share the token embedding with the output projection.
    tie_embeddings: bool = True
    # Computation dtype, one of DTYPES; logits are float32 whatever it is.
    dtype: str = "float32"
    # Storage dtype of the projections' and the token embedding's parameters, one of PARAM_DTYPES
    # (norms and position tables stay float32; ``decodelab.model.layers`` says how 16-bit weights
    # are computed with).
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        # Stored as Python ints (a NumPy int would not survive the JSON of a checkpoint).
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len",
                     "t5_num_buckets", "t5_max_distance"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        for name in ("n_kv_heads", "head_dim", "d_ff", "rope_original_max_len"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        if self.head_dim is None:
            _require(
                self.d_model % self.n_heads == 0,
                f"d_model must be divisible by n_heads when head_dim is not given, "
                f"got d_model={self.d_model}, n_heads={self.n_heads}",
            )
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        _require(
            self.n_heads % self.n_kv_heads == 0,
            f"n_heads must be divisible by n_kv_heads, got n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}",
        )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.rope_original_max_len is None:
            object.__setattr__(self, "rope_original_max_len", self.max_seq_len)

        check_one_of("position", self.position, POSITIONS)
        check_one_of("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check_one_of("norm", self.norm, NORMS)
        check_one_of("mlp", self.mlp, MLPS)
        check_one_of("dtype", self.dtype, DTYPES)
        check_one_of("param_dtype", self.param_dtype, PARAM_DTYPES)
        for name in ("rope_theta", "norm_eps", "yarn_beta_fast", "yarn_beta_slow",
                     "llama3_low_freq_factor", "llama3_high_freq_factor", "rope_scaling_factor"):
            check_number(name, getattr(self, name), 0, open_low=True)
        _require(
            self.rope_scaling_factor >= 1.0,
            f"rope_scaling_factor must be >= 1.0 (it extends the context), got "
            f"{self.rope_scaling_factor!r}",
        )
        _require(
            self.yarn_beta_fast > self.yarn_beta_slow,
            f"yarn_beta_fast must be > yarn_beta_slow, got {self.yarn_beta_fast} <= "
            f"{self.yarn_beta_slow}",
        )
        _require(
            self.llama3_high_freq_factor > self.llama3_low_freq_factor,
            f"llama3_high_freq_factor must be > llama3_low_freq_factor, got "
            f"{self.llama3_high_freq_factor} <= {self.llama3_low_freq_factor}",
        )
        for name in ("tie_embeddings", "attention_bias", "mlp_bias"):
            check_bool(name, getattr(self, name))
        if self.position == "rope":
            _require(
                self.head_dim % 2 == 0,
                f"head_dim must be even for position='rope' (dimensions rotate in pairs), "
                f"got head_dim={self.head_dim}",
            )
        if self.position == "sinusoidal":
            _require(
                self.d_model % 2 == 0,
                f"d_model must be even for position='sinusoidal', got d_model={self.d_model}",
            )
        if self.rope_scaling != "none":
            _require(
                self.position == "rope",
                f"rope_scaling={self.rope_scaling!r} needs position='rope', "
                f"got position={self.position!r}",
            )

    @property
    def n_groups(self) -> int:
        """G = N // K: query heads that share one key/value head."""
        return self.n_heads // self.n_kv_heads

    def _derived_defaults(self) -> dict[str, Any]:
        return {"n_kv_heads": self.n_heads, "head_dim": self.d_model // self.n_heads,
                "d_ff": 4 * self.d_model, "rope_original_max_len": self.max_seq_len}

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed, validated again.

        A derived field still at its default (e.g. ``d_ff == 4 * d_model``) is derived again from
        the new values unless ``changes`` sets it, so ``replace(d_model=128)`` scales ``head_dim``
        and ``d_ff`` along instead of keeping the old ones.
        """
        for name, default in self._derived_defaults().items():
            if name not in changes and getattr(self, name) == default:
                changes[name] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key_dict(self) -> dict[str, Any]:
        """``to_dict`` without the CHECKPOINT_FIELDS that are at their defaults: what cache keys
        hash."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: v for k, v in self.to_dict().items()
                if k not in CHECKPOINT_FIELDS or v != defaults[k]}

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        _require(not unknown, f"ModelConfig fields must be among {sorted(known)}, got {unknown}")
        return cls(**fields)

    def num_params(self) -> int:
        """Parameter count, embeddings included (matches the Transformer it builds)."""
        D, F, L, V = self.d_model, self.d_ff, self.n_layers, self.vocab_size
        N, K, H = self.n_heads, self.n_kv_heads, self.head_dim
        attn = D * N * H + 2 * D * K * H + N * H * D
        if self.attention_bias:
            attn += N * H + 2 * K * H + D
        mlp = (3 if self.mlp == "swiglu" else 2) * D * F
        if self.mlp_bias:
            mlp += (2 if self.mlp == "swiglu" else 1) * F + D
        norm = D if self.norm == "rms" else 2 * D
        total = V * D + L * (attn + mlp + 2 * norm) + norm
        if not self.tie_embeddings:
            total += D * V
        if self.position == "learned":
            total += self.max_seq_len * D
        if self.position == "t5":
            total += self.t5_num_buckets * N
        return total
