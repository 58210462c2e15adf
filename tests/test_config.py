"""ModelConfig: validation names the bad field, defaults resolve, round trips, parameter count."""

import dataclasses
import itertools
import math

import pytest
from flax import nnx

import decodelab as dl
from decodelab import config
from decodelab.model import layers, positions

# --- Validation: every error is a ValueError that starts with the field's name -------------------


def test_d_model_not_divisible_by_n_heads_is_rejected(tiny_config):
    with pytest.raises(ValueError, match="^d_model must be divisible by n_heads"):
        tiny_config.replace(d_model=66)


def test_replace_derives_defaulted_fields_again_and_keeps_given_ones(tiny_config):
    wider = dl.ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4).replace(d_model=128)
    assert (wider.head_dim, wider.d_ff, wider.n_kv_heads) == (32, 512, 4)
    longer = wider.replace(max_seq_len=512)
    assert longer.rope_original_max_len == 512
    assert tiny_config.replace(d_ff=100).replace(d_model=128).d_ff == 100


def test_d_model_need_not_divide_when_head_dim_is_given(tiny_config):
    cfg = tiny_config.replace(d_model=66, head_dim=16)
    assert cfg.head_dim == 16


def test_n_heads_not_divisible_by_n_kv_heads_is_rejected(tiny_config):
    with pytest.raises(ValueError, match="^n_heads must be divisible by n_kv_heads.*n_kv_heads=3"):
        tiny_config.replace(n_kv_heads=3)


@pytest.mark.parametrize("field", ["position", "rope_scaling", "norm", "mlp", "dtype"])
def test_unknown_choice_is_rejected(tiny_config, field):
    with pytest.raises(ValueError, match=f"^{field} must be one of .*got 'bogus'"):
        tiny_config.replace(**{field: "bogus"})


def test_rope_with_odd_head_dim_is_rejected(tiny_config):
    with pytest.raises(ValueError, match="^head_dim must be even for position='rope'"):
        tiny_config.replace(position="rope", head_dim=15)


@pytest.mark.parametrize("position", ["learned", "t5", "alibi", "nope"])
def test_odd_head_dim_is_allowed_without_rope(tiny_config, position):
    assert tiny_config.replace(position=position, head_dim=15).head_dim == 15


def test_sinusoidal_with_odd_d_model_is_rejected(tiny_config):
    with pytest.raises(ValueError, match="^d_model must be even for position='sinusoidal'"):
        tiny_config.replace(position="sinusoidal", d_model=63, head_dim=16)


INT_FIELDS = ["vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
              "max_seq_len", "rope_original_max_len", "t5_num_buckets", "t5_max_distance"]


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("field", INT_FIELDS)
def test_non_positive_int_is_rejected(tiny_config, field, value):
    with pytest.raises(ValueError, match=f"^{field} must be an int >= 1, got {value}"):
        tiny_config.replace(**{field: value})


@pytest.mark.parametrize("field", INT_FIELDS)
def test_bool_is_not_accepted_as_int(tiny_config, field):
    with pytest.raises(ValueError, match=f"^{field} must be an int >= 1, got True"):
        tiny_config.replace(**{field: True})


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "max_seq_len"])
def test_float_is_not_accepted_as_int(tiny_config, field):
    with pytest.raises(ValueError, match=f"^{field} must be an int >= 1, got 64.0"):
        tiny_config.replace(**{field: 64.0})


@pytest.mark.parametrize("field", ["tie_embeddings", "attention_bias", "mlp_bias"])
def test_flag_must_be_a_bool(tiny_config, field):
    with pytest.raises(ValueError, match=f"^{field} must be a bool, got 1"):
        tiny_config.replace(**{field: 1})


@pytest.mark.parametrize("field", ["rope_theta", "norm_eps", "yarn_beta_fast", "yarn_beta_slow",
                                   "rope_scaling_factor", "llama3_low_freq_factor",
                                   "llama3_high_freq_factor"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, True, "1.0"])
def test_float_field_must_be_finite_and_positive(tiny_config, field, value):
    with pytest.raises(ValueError, match=f"^{field} must be a finite number > 0"):
        tiny_config.replace(**{field: value})


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn", "dynamic", "llama3"])
def test_rope_scaling_factor_below_one_is_rejected(tiny_config, scaling):
    with pytest.raises(ValueError, match=r"^rope_scaling_factor must be >= 1.0.*got 0.5"):
        tiny_config.replace(rope_scaling=scaling, rope_scaling_factor=0.5)


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "t5", "alibi", "nope"])
def test_rope_scaling_without_rope_is_rejected(tiny_config, position):
    with pytest.raises(ValueError, match="^rope_scaling='linear' needs position='rope'"):
        tiny_config.replace(position=position, rope_scaling="linear", rope_scaling_factor=2.0)


@pytest.mark.parametrize("fast, slow", [(1.0, 1.0), (1.0, 32.0)])
def test_yarn_beta_fast_must_exceed_beta_slow(tiny_config, fast, slow):
    with pytest.raises(ValueError, match="^yarn_beta_fast must be > yarn_beta_slow"):
        tiny_config.replace(yarn_beta_fast=fast, yarn_beta_slow=slow)


@pytest.mark.parametrize("low, high", [(4.0, 4.0), (4.0, 1.0)])
def test_llama3_high_freq_factor_must_exceed_low(tiny_config, low, high):
    with pytest.raises(ValueError, match="^llama3_high_freq_factor must be > llama3_low"):
        tiny_config.replace(llama3_low_freq_factor=low, llama3_high_freq_factor=high)


# --- Defaults, immutability, serialisation -------------------------------------------------------


def test_optional_fields_resolve_to_conventional_defaults():
    cfg = dl.ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=128)
    assert cfg.n_kv_heads == 4
    assert cfg.head_dim == 16
    assert cfg.d_ff == 256
    assert cfg.rope_original_max_len == 128
    assert cfg.n_groups == 1


def test_given_optional_fields_are_kept(tiny_config):
    cfg = tiny_config.replace(n_kv_heads=1, head_dim=8, d_ff=100, rope_original_max_len=32)
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.rope_original_max_len) == (1, 8, 100, 32)
    assert cfg.n_groups == 4


def test_config_is_frozen_and_hashable(tiny_config):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config.d_model = 128
    assert hash(tiny_config) == hash(tiny_config.replace())
    assert tiny_config == tiny_config.replace()


def test_to_dict_from_dict_round_trip(tiny_config):
    cfg = tiny_config.replace(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0,
                              norm="layer", mlp="gelu", tie_embeddings=False, dtype="bfloat16")
    fields = cfg.to_dict()
    assert fields["head_dim"] == 16 and fields["rope_original_max_len"] == 64  # fully explicit
    assert dl.ModelConfig.from_dict(fields) == cfg


def test_from_dict_rejects_unknown_keys(tiny_config):
    fields = {**tiny_config.to_dict(), "n_experts": 8}
    with pytest.raises(ValueError, match=r"^ModelConfig fields must be among .*\['n_experts'\]"):
        dl.ModelConfig.from_dict(fields)


# --- Parameter count and registries ---------------------------------------------------------------


@pytest.mark.parametrize(
    "position, norm, mlp, tie",
    list(itertools.product(config.POSITIONS, config.NORMS, config.MLPS, [True, False])),
)
def test_num_params_matches_the_built_model(tiny_config, position, norm, mlp, tie):
    cfg = tiny_config.replace(position=position, norm=norm, mlp=mlp, tie_embeddings=tie)
    model = nnx.eval_shape(lambda: dl.Transformer(cfg, rngs=nnx.Rngs(0)))  # shapes only
    assert cfg.num_params() == dl.param_count(model)


@pytest.mark.parametrize("mlp, attention_bias, mlp_bias",
                         list(itertools.product(config.MLPS, [True, False], [True, False])))
def test_num_params_matches_with_biases(tiny_config, mlp, attention_bias, mlp_bias):
    cfg = tiny_config.replace(mlp=mlp, attention_bias=attention_bias, mlp_bias=mlp_bias)
    model = nnx.eval_shape(lambda: dl.Transformer(cfg, rngs=nnx.Rngs(0)))
    assert cfg.num_params() == dl.param_count(model)


@pytest.mark.parametrize("n_kv_heads, head_dim", [(1, 8), (4, 32)])
def test_num_params_matches_with_explicit_head_shapes(tiny_config, n_kv_heads, head_dim):
    cfg = tiny_config.replace(n_kv_heads=n_kv_heads, head_dim=head_dim)
    model = nnx.eval_shape(lambda: dl.Transformer(cfg, rngs=nnx.Rngs(0)))
    assert cfg.num_params() == dl.param_count(model)


def test_tiny_num_params_by_hand(tiny_config):
    # V*D + L * (attn + mlp + 2 norms) + final norm, tied, rope (no position parameters):
    # attn = D*N*H + 2*D*K*H + N*H*D = 4096 + 4096 + 4096; swiglu = 3*D*F = 49152; rms = D.
    assert tiny_config.num_params() == 512 * 64 + 2 * (12288 + 49152 + 128) + 64


@pytest.mark.parametrize(
    "names, registry",
    [
        (config.POSITIONS, positions.POSITION_ENCODINGS),
        (config.ROPE_SCALINGS, positions.ROPE_SCALING_RULES),
        (config.NORMS, layers.NORMS),
        (config.MLPS, layers.MLPS),
    ],
    ids=["positions", "rope_scalings", "norms", "mlps"],
)
def test_config_names_equal_registry_keys(names, registry):
    assert sorted(names) == sorted(registry)
    assert len(set(names)) == len(names)


# --- Cache keys -----------------------------------------------------------------------------------


def test_key_dict_leaves_out_checkpoint_fields_at_their_defaults(tiny_config):
    assert set(tiny_config.to_dict()) - set(tiny_config.key_dict()) == set(config.CHECKPOINT_FIELDS)
    biased = tiny_config.replace(attention_bias=True)
    assert biased.key_dict()["attention_bias"] is True


def test_size_preset_sections_keep_the_keys_they_had_before_checkpoint_fields():
    # The fields a section and a config's cache key held before CHECKPOINT_FIELDS existed: with
    # the same fields (and values), results rows and cached models made then are still found.
    from decodelab.experiment import presets

    before = {"d_ff", "d_model", "dtype", "head_dim", "max_seq_len", "mlp", "n_heads",
              "n_kv_heads", "n_layers", "norm", "norm_eps", "position", "rope_original_max_len",
              "rope_scaling", "rope_scaling_factor", "rope_theta", "t5_max_distance",
              "t5_num_buckets", "tie_embeddings", "yarn_beta_fast", "yarn_beta_slow"}
    for preset in ("tiny", "small"):
        assert set(presets.model_section(preset).to_dict()) == before
    small = presets.build_model_config(presets.model_section("small"), 4096)
    assert set(small.key_dict()) == before | {"vocab_size"}