"""Tests for decodelab.text.tokenizer: exact round trips, fixed special ids, determinism, bad input."""

import random

import numpy as np
import pytest
import sentencepiece as spm

from decodelab.text import data
from decodelab.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

VOCAB_SIZE = 512


@pytest.fixture(scope="module")
def train_files(tmp_path_factory):
    return data.write_split_files("train", tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def small_files(train_files):
    return [f for f in train_files if f.stem in ("sonnets", "tempest")]


@pytest.fixture(scope="module")
def tokenizers(train_files, small_files):
    """A BPE tokenizer trained on the whole train split and a unigram one on two documents."""
    return {
        "bpe": Tokenizer.train(train_files, VOCAB_SIZE, "bpe"),
        "unigram": Tokenizer.train(small_files, VOCAB_SIZE, "unigram"),
    }


@pytest.fixture(params=["bpe", "unigram"])
def tokenizer(request, tokenizers):
    return tokenizers[request.param]


ROUND_TRIP_TEXTS = [
    "",
    " ",
    "   ",
    "  leading spaces",
    "trailing spaces  ",
    "repeated   inner    spaces",
    "\n",
    "\n\nblank lines\n\n\n",
    "tab\tand\r\nCRLF\rCR",
    "\x00\x01\x7f control characters",
    "To be, or not to be: that is the question.",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧",
    "Привет, мир! Ёжик",
    "你好，世界。日本語のテキスト 한국어",
    "e\u0301 combining accent, \u00e9 precomposed",
    "\ufeffbyte order mark, \u200bzero width space, \ufffd replacement character",
    "▁ the piece marker itself, <s> </s> <pad> <unk> <0x41> as plain text",
    "ab" * 2000,
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_decode_inverts_encode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_random_unicode_round_trips(tokenizer):
    rng = random.Random(0)
    # Half the characters from all of Unicode but the surrogates (which a valid str cannot hold),
    # half from those a whitespace-aware tokenizer is most likely to get wrong.
    code_points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    tricky = [" ", "  ", "\n", "\t", "\r", "\x00", "\u2581", "\u3000", "\u0301", "e", "<s>", "😀"]
    for _ in range(300):
        text = "".join(
            rng.choice(code_points if rng.random() < 0.5 else tricky)
            for _ in range(rng.randint(1, 30))
        )
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_unseen_characters_fall_back_to_bytes(tokenizer):
    ids = tokenizer.encode("你好😀")
    assert UNK_ID not in ids
    assert [tokenizer.id_to_piece(i) for i in ids[:3]] == ["<0xE4>", "<0xBD>", "<0xA0>"]
    assert len(ids) == 3 + 3 + 4


def test_newline_is_the_byte_piece(tokenizer):
    assert tokenizer.encode("\n") == [4 + 0x0A]


def test_literal_space_marker_is_spelled_in_bytes(tokenizer):
    a, space = tokenizer.encode("a"), tokenizer.encode(" ")
    assert tokenizer.encode("a\u2581 ") == [*a, 4 + 0xE2, 4 + 0x96, 4 + 0x81, *space]


def test_special_ids_are_fixed(tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    pieces = [tokenizer.id_to_piece(i) for i in (0, 1, 2, 3, 4, 259)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>", "<0x00>", "<0xFF>"]
    assert tokenizer.vocab_size == VOCAB_SIZE


def test_encode_adds_bos_and_eos_on_request(tokenizer):
    ids = tokenizer.encode("Hamlet")
    assert tokenizer.encode("Hamlet", add_bos=True, add_eos=True) == [BOS_ID, *ids, EOS_ID]
    assert tokenizer.encode("Hamlet", add_bos=True) == [BOS_ID, *ids]


def test_decode_ignores_pad_bos_eos(tokenizer):
    ids = tokenizer.encode("O Romeo, Romeo!")
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "O Romeo, Romeo!"


def test_decode_accepts_int_arrays(tokenizer):
    ids = tokenizer.encode("Exeunt.")
    assert tokenizer.decode(np.asarray(ids, dtype=np.int32)) == "Exeunt."
    assert tokenizer.decode(np.asarray([], dtype=np.int32)) == ""


def test_shakespeare_compresses_better_with_bpe_than_bytes(tokenizers):
    text = data.split_documents("validation")["julius_caesar"][:20_000]
    assert len(tokenizers["bpe"].encode(text)) < 0.6 * len(text)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_training_is_deterministic(small_files, model_type):
    first = Tokenizer.train(small_files, 400, model_type)
    second = Tokenizer.train(list(small_files), 400, model_type)
    assert first.serialized_model() == second.serialized_model()


def test_subsampling_is_seeded(small_files):
    def model(seed):
        return Tokenizer.train(small_files, 400, max_sentences=500, seed=seed).serialized_model()

    assert model(0) == model(0)
    assert model(0) != model(1)


def test_training_writes_no_files(tmp_path, monkeypatch, small_files):
    monkeypatch.chdir(tmp_path)
    before = sorted(small_files[0].parent.iterdir())
    Tokenizer.train(small_files, 400)
    assert list(tmp_path.iterdir()) == []
    assert sorted(small_files[0].parent.iterdir()) == before


def test_serialized_model_round_trips(tokenizer):
    restored = Tokenizer.from_serialized(tokenizer.serialized_model())
    assert restored.serialized_model() == tokenizer.serialized_model()
    assert restored.encode("Fair is foul") == tokenizer.encode("Fair is foul")


def test_save_then_load_gives_the_same_model(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "tok.model")
    assert Tokenizer.load(tmp_path / "tok.model").serialized_model() == tokenizer.serialized_model()


def test_load_of_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(ValueError, match="path must be an existing tokenizer model file.*nope.model"):
        Tokenizer.load(tmp_path / "nope.model")


def test_reported_vocab_bounds_are_exact(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("hello world\nhello there\n")
    # 260 specials and bytes + 9 characters (h e l o w r d t and the space marker).
    with pytest.raises(ValueError, match=r"vocab_size must be >= 269 for these files.*got 268"):
        Tokenizer.train([path], 268)
    with pytest.raises(ValueError, match=r"vocab_size must be <= \d+ .*got 1000") as error:
        Tokenizer.train([path], 1000)
    largest = int(error.value.args[0].split("<= ")[1].split()[0])
    assert Tokenizer.train([path], largest).vocab_size == largest
    assert Tokenizer.train([path], 269).vocab_size == 269


@pytest.mark.parametrize(
    "make_files, kwargs, message",
    [
        (lambda d: [], {}, r"files must name at least one file, got \[\]"),
        (lambda d: str(d / "a.txt"), {}, r"files must be an iterable of paths, got '.*a\.txt'"),
        (lambda d: [d / "missing.txt"], {}, r"files must all exist, got missing \['.*missing"),
        (lambda d: [d / "empty.txt", d / "blank.txt"], {}, r"files must contain non-whitespace"),
        (lambda d: [d / "latin1.txt"], {}, r"files must be UTF-8 text, got '.*latin1\.txt'"),
        (lambda d: [d / "a.txt"], dict(vocab_size=10), r"vocab_size must be an int >= 260, got 10"),
        (lambda d: [d / "a.txt"], dict(vocab_size=300.0), r"vocab_size must be an int >= 260"),
        (
            lambda d: [d / "a.txt"],
            dict(model_type="wordpiece"),
            r"model_type must be one of \('bpe', 'unigram'\), got 'wordpiece'",
        ),
        (lambda d: [d / "a.txt"], dict(num_threads=0), r"num_threads must be an int >= 1, got 0"),
        (lambda d: [d / "a.txt"], dict(max_sentences=0), r"max_sentences must be an int >= 1"),
        (lambda d: [d / "a.txt"], dict(seed=-1), r"seed must be an int >= 0, got -1"),
    ],
)
def test_train_rejects_bad_input(tmp_path, make_files, kwargs, message):
    (tmp_path / "a.txt").write_text("some text\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\n \t\n")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    arguments = dict(vocab_size=300) | kwargs
    with pytest.raises(ValueError, match=message):
        Tokenizer.train(make_files(tmp_path), **arguments)


@pytest.mark.parametrize(
    "text, message",
    [
        (b"bytes", r"text must be a str, got bytes"),
        (None, r"text must be a str, got NoneType"),
        (["list"], r"text must be a str, got list"),
        ("a\ud800b", r"text must be valid Unicode, got lone surrogate '\\ud800' at index 1"),
    ],
)
def test_encode_rejects_bad_text(tokenizers, text, message):
    with pytest.raises(ValueError, match=message):
        tokenizers["bpe"].encode(text)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([5, -1], r"ids must be in \[0, 512\), got \[-1\]"),
        ([5, 512, 600], r"ids must be in \[0, 512\), got \[512, 600\]"),
        ([1.0, 2.0], r"ids must be a 1-D sequence of ints, got shape \(2,\) of float64"),
        ([[5, 6]], r"ids must be a 1-D sequence of ints, got shape \(1, 2\)"),
        ([True], r"ids must be a 1-D sequence of ints, got shape \(1,\) of bool"),
    ],
)
def test_decode_rejects_bad_ids(tokenizers, ids, message):
    with pytest.raises(ValueError, match=message):
        tokenizers["bpe"].decode(ids)


def test_id_to_piece_rejects_out_of_range_ids(tokenizers):
    with pytest.raises(ValueError, match=r"token_id must be in \[0, 512\), got \[512\]"):
        tokenizers["bpe"].id_to_piece(512)


@pytest.mark.parametrize(
    "serialized, message",
    [
        ("not bytes", r"serialized_model must be bytes, got str"),
        (b"\x00garbage", r"serialized_model must be a SentencePiece model, got 8 bytes"),
    ],
)
def test_from_serialized_rejects_non_models(serialized, message):
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_serialized(serialized)


def test_from_serialized_rejects_models_with_other_special_ids(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 10)
    model = tmp_path / "default"
    # SentencePiece's own defaults: unk 0, bos 1, eos 2, no pad, no byte fallback.
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "a.txt"), model_prefix=str(model), vocab_size=12, minloglevel=2
    )
    message = r"processor must have pad/unk/bos/eos ids \(0, 1, 2, 3\), got \(-1, 0, 1, 2\)"
    with pytest.raises(ValueError, match=message):
        Tokenizer.load(model.with_suffix(".model"))
