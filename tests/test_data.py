"""Tests for decodelab.text.data: the bundled corpus, its splits, token streams and batches."""

import hashlib
import json
import lzma
import shutil
import socket

import numpy as np
import pytest
from standins import Chars

from decodelab.text import data


def _sha256sums():
    lines = (data.CORPUS_DIR / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split() for line in lines)}


def test_corpus_has_42_documents_named_after_their_files():
    corpus = data.load_corpus()
    assert len(corpus) == 42
    assert list(corpus) == sorted(corpus)
    assert {"hamlet", "sonnets", "rape_of_lucrece", "henry_vi_part_2"} <= set(corpus)
    assert not any(name.endswith(("_gut", "_f")) for name in corpus)
    assert corpus["hamlet"].startswith("HAMLET, PRINCE OF DENMARK\n")
    assert sum(map(len, corpus.values())) == 5_057_198


def test_corpus_matches_both_checksums():
    sums = _sha256sums()
    archive = (data.CORPUS_DIR / data.ARCHIVE_NAME).read_bytes()
    assert hashlib.sha256(archive).hexdigest() == sums[data.ARCHIVE_NAME]
    payload = json.dumps(data.load_corpus(), sort_keys=True, ensure_ascii=False).encode()
    assert hashlib.sha256(payload).hexdigest() == sums[data.PAYLOAD_NAME]


@pytest.fixture
def corpus_copy(tmp_path, monkeypatch):
    """A writable copy of the corpus directory that load_corpus reads instead of the real one."""
    copy = tmp_path / "corpus"
    shutil.copytree(data.CORPUS_DIR, copy)
    monkeypatch.setattr(data, "CORPUS_DIR", copy)
    return copy


def test_corrupted_archive_is_rejected(corpus_copy):
    archive = bytearray((corpus_copy / data.ARCHIVE_NAME).read_bytes())
    archive[1000] ^= 1
    (corpus_copy / data.ARCHIVE_NAME).write_bytes(bytes(archive))
    with pytest.raises(ValueError, match=r"shakespeare\.json\.xz must have sha256 484841b7"):
        data.load_corpus()


def test_archive_with_edited_text_is_rejected(corpus_copy):
    corpus = json.loads(lzma.decompress((corpus_copy / data.ARCHIVE_NAME).read_bytes()))
    corpus["hamlet"] = corpus["hamlet"].replace("Denmark", "Norway")
    archive = lzma.compress(json.dumps(corpus, sort_keys=True).encode(), preset=0)
    (corpus_copy / data.ARCHIVE_NAME).write_bytes(archive)
    sums = _sha256sums()
    sums[data.ARCHIVE_NAME] = hashlib.sha256(archive).hexdigest()
    (corpus_copy / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sums.items()))
    with pytest.raises(ValueError, match=r"shakespeare\.json must have sha256 3d29aa21"):
        data.load_corpus()


def test_loading_never_touches_the_network(corpus_copy, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("decodelab.text.data must not use the network")

    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, no_network)
    # A fresh copy of the corpus directory: read from disk now, not from an earlier call's cache.
    assert len(data.load_corpus()) == 42
    assert len(data.token_stream(Chars(), "test")) == data.split_num_chars("test") + 6


def test_load_corpus_returns_a_fresh_dict():
    data.load_corpus()["hamlet"] = "edited"
    assert data.load_corpus()["hamlet"].startswith("HAMLET")


def test_held_out_splits_are_the_named_plays():
    validation = ["julius_caesar", "richard_ii", "twelfth_night"]
    assert list(data.split_documents("validation")) == validation
    assert list(data.split_documents("test")) == ["john", "macbeth", "merchant_of_venice"]


def test_splits_are_disjoint_and_cover_the_corpus():
    names = [set(data.split_documents(split)) for split in data.SPLITS]
    assert sum(map(len, names)) == 42
    assert set.union(*names) == set(data.load_corpus())
    assert {"sonnets", "lovers_complaint", "phoenix_and_the_turtle"} <= names[0]


def test_split_documents_are_sorted_and_unchanged():
    corpus = data.load_corpus()
    for split in data.SPLITS:
        docs = data.split_documents(split)
        assert list(docs) == sorted(docs)
        assert all(corpus[name] == text for name, text in docs.items())


def test_split_num_chars_counts_the_documents_characters():
    assert data.split_num_chars("validation") == 116_216 + 130_293 + 114_876
    assert sum(map(data.split_num_chars, data.SPLITS)) == 5_057_198


@pytest.mark.parametrize("function", [data.split_documents, data.split_num_chars])
def test_unknown_split_is_rejected(function):
    message = r"split must be one of \('train', 'validation', 'test'\), got 'valid'"
    with pytest.raises(ValueError, match=message):
        function("valid")


def test_write_split_files_writes_each_document_verbatim(tmp_path):
    paths = data.write_split_files("test", tmp_path / "new")
    assert [p.name for p in paths] == ["john.txt", "macbeth.txt", "merchant_of_venice.txt"]
    docs = data.split_documents("test")
    assert [p.read_bytes().decode("utf-8") for p in paths] == list(docs.values())


def test_token_stream_is_bos_ids_eos_per_document_in_sorted_order():
    tokenizer = Chars()
    stream = data.token_stream(tokenizer, "validation")
    expected = []
    for text in data.split_documents("validation").values():
        expected += [2, *tokenizer.encode(text), 3]
    assert stream.dtype == np.int32
    np.testing.assert_array_equal(stream, expected)


def test_token_windows_are_evenly_spaced_from_the_start_to_one_before_the_end():
    stream = data.token_stream(Chars(), "test")
    windows = data.token_windows(Chars(), "test", 3, 5)
    last = len(stream) - 5 - 1
    assert windows.dtype == np.int32 and windows.shape == (3, 5)
    for window, start in zip(windows, (0, last // 2, last)):
        np.testing.assert_array_equal(window, stream[start:start + 5])
    with pytest.raises(ValueError, match="num must be an int >= 1, got 0"):
        data.token_windows(Chars(), "test", 0, 5)


def test_eval_windows_tile_the_targets():
    windows = data.eval_windows(np.arange(11), seq_len=4)
    np.testing.assert_array_equal(windows, [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]])
    assert windows.dtype == np.int32
    np.testing.assert_array_equal(windows[:, 1:].ravel(), np.arange(1, 9))


@pytest.mark.parametrize(
    "stream, seq_len, message",
    [
        (np.arange(4), 4, r"stream must hold at least seq_len \+ 1 = 5 tokens, got 4"),
        (np.arange(10), 0, r"seq_len must be an int >= 1, got 0"),
        (np.zeros((2, 8), np.int32), 4, r"stream must be a 1-D array .*got shape \(2, 8\)"),
        (np.zeros(8, np.float32), 4, r"stream must be a 1-D array .*got shape \(8,\) of float32"),
    ],
)
def test_eval_windows_rejects_bad_input(stream, seq_len, message):
    with pytest.raises(ValueError, match=message):
        data.eval_windows(stream, seq_len)


def test_token_windows_are_evenly_spaced_slices_of_the_split_stream():
    tokenizer = Chars()
    stream = data.token_stream(tokenizer, "test")
    windows = data.token_windows(tokenizer, "test", 5, 8)
    assert windows.shape == (5, 8) and windows.dtype == np.int32
    # Starts 0, M/4, M/2, 3M/4, M (rounded down), M = N - 9: the last leaves one token after it.
    last = len(stream) - 9
    np.testing.assert_array_equal(windows[0], stream[:8])
    np.testing.assert_array_equal(windows[2], stream[last // 2:last // 2 + 8])
    np.testing.assert_array_equal(windows[4], stream[last:last + 8])


@pytest.mark.parametrize("num, length, message", [
    (0, 8, r"num must be an int >= 1, got 0"),
    (4, 2.0, r"length must be an int >= 1, got 2.0"),
    (4, 10**7, r"length must be less than the test stream's \d+ tokens, got 10000000"),
])
def test_token_windows_reject_bad_sizes(num, length, message):
    with pytest.raises(ValueError, match=message):
        data.token_windows(Chars(), "test", num, length)


# 23 windows of 4 + 1 tokens (and 3 tokens left over); window w starts with token 5 * w.
SEQ_LEN = 4
STREAM = np.arange(23 * (SEQ_LEN + 1) + 3, dtype=np.int32)


def _visited_windows(batches, num_steps):
    return np.concatenate([batches.batch(step)[:, 0] // (SEQ_LEN + 1) for step in range(num_steps)])


def test_windows_are_non_overlapping_slices_of_the_stream():
    batches = data.PackedBatches(STREAM, batch_size=3, seq_len=SEQ_LEN, seed=0)
    assert batches.windows_per_epoch == 23
    batch = batches.batch(0)
    assert batch.shape == (3, SEQ_LEN + 1) and batch.dtype == np.int32
    np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(SEQ_LEN + 1))
    assert np.all(batch[:, 0] % (SEQ_LEN + 1) == 0)


def test_each_epoch_visits_every_window_once():
    # 5 does not divide 23, so batches 4 and 9 straddle epoch boundaries.
    batches = data.PackedBatches(STREAM, batch_size=5, seq_len=SEQ_LEN, seed=3)
    visits = _visited_windows(batches, num_steps=14)  # 70 visits: three epochs and one window
    for epoch in range(3):
        epoch_visits = visits[23 * epoch : 23 * (epoch + 1)]
        np.testing.assert_array_equal(epoch_visits, batches.epoch_order(epoch))
        np.testing.assert_array_equal(np.sort(epoch_visits), np.arange(23))


def test_epoch_order_depends_on_seed_and_epoch():
    orders = [
        data.PackedBatches(STREAM, 5, SEQ_LEN, seed).epoch_order(epoch)
        for seed in (0, 1)
        for epoch in (0, 1)
    ]
    assert len({tuple(order) for order in orders}) == 4


def test_batch_is_a_pure_function_of_seed_and_step():
    uninterrupted = data.PackedBatches(STREAM, batch_size=4, seq_len=SEQ_LEN, seed=7)
    expected = [uninterrupted.batch(step) for step in range(12)]
    resumed = data.PackedBatches(STREAM.copy(), batch_size=4, seq_len=SEQ_LEN, seed=7)
    for step in (9, 5, 11, 0, 5):
        np.testing.assert_array_equal(resumed.batch(step), expected[step])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(stream=np.arange(4)), r"stream must hold at least one window of seq_len \+ 1 = 5"),
        (dict(batch_size=0), r"batch_size must be an int >= 1, got 0"),
        (dict(seq_len=0), r"seq_len must be an int >= 1, got 0"),
        (dict(seq_len=2.0), r"seq_len must be an int >= 1, got 2.0"),
        (dict(seed=-1), r"seed must be an int >= 0, got -1"),
        (dict(stream=np.zeros((3, 9), np.int32)), r"stream must be a 1-D array of token ids"),
    ],
)
def test_packed_batches_rejects_bad_arguments(kwargs, message):
    arguments = dict(stream=STREAM, batch_size=2, seq_len=SEQ_LEN, seed=0) | kwargs
    with pytest.raises(ValueError, match=message):
        data.PackedBatches(**arguments)


@pytest.mark.parametrize("step", [-1, 1.5, True])
def test_batch_and_epoch_order_reject_bad_indices(step):
    batches = data.PackedBatches(STREAM, batch_size=2, seq_len=SEQ_LEN, seed=0)
    with pytest.raises(ValueError, match=f"step must be an int >= 0, got {step}"):
        batches.batch(step)
    with pytest.raises(ValueError, match=f"epoch must be an int >= 0, got {step}"):
        batches.epoch_order(step)


def test_batches_do_not_change_when_the_stream_is_edited():
    stream = STREAM.copy()
    batches = data.PackedBatches(stream, batch_size=2, seq_len=SEQ_LEN, seed=0)
    before = batches.batch(3)
    stream[:] = 0
    np.testing.assert_array_equal(batches.batch(3), before)
