"""The bundled Shakespeare corpus: loading, document-level splits, token streams and batches.

Nothing here touches the network: the corpus is read from `decodelab/corpus/` (built by
`scripts/build_corpus.py`, see ATTRIBUTION.md there) and checked against its SHA256SUMS.

A token stream is every document of a split, in sorted name order, each as `bos + ids + eos`,
concatenated into one int32 array. Training and evaluation cut it into windows of `seq_len + 1`
tokens (inputs `w[:-1]`, targets `w[1:]`) that ignore document boundaries; bos/eos mark them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
import pathlib
from typing import Protocol

import numpy as np

from decodelab.checks import check_int

CORPUS_DIR = pathlib.Path(__file__).resolve().parent / "corpus"
ARCHIVE_NAME = "shakespeare.json.xz"
PAYLOAD_NAME = "shakespeare.json"

SPLITS = ("train", "validation", "test")
# Whole plays are held out, one tragedy, one comedy and one history per split, each mid-sized
# (100-130k characters, about 7% of the corpus per split). None is one part of a multi-part play
# (Henry IV/VI), whose other parts in train would share its characters and plot. The Sonnets and
# the poems stay in train: they are too different in form to measure the plays by.
VALIDATION_DOCS = ("julius_caesar", "richard_ii", "twelfth_night")
TEST_DOCS = ("john", "macbeth", "merchant_of_venice")
_HELD_OUT = {"validation": VALIDATION_DOCS, "test": TEST_DOCS}


class TextTokenizer(Protocol):
    """What `token_stream` needs from a tokenizer (decodelab.Tokenizer is one)."""

    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


def load_corpus() -> dict[str, str]:
    """{document name: text} for all 42 documents, sorted by name; checksums verified.

    Raises ValueError if the bundled files do not match SHA256SUMS.
    """
    # A fresh dict per call, so that a caller's edits cannot reach the cached copy.
    return dict(_verified_corpus(CORPUS_DIR))


@functools.lru_cache(maxsize=2)
def _verified_corpus(directory: pathlib.Path) -> dict[str, str]:
    expected = {}
    for line in (directory / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        expected[name] = digest
    archive = (directory / ARCHIVE_NAME).read_bytes()
    _check_sha256(directory / ARCHIVE_NAME, archive, expected[ARCHIVE_NAME])
    payload = lzma.decompress(archive)
    _check_sha256(directory / PAYLOAD_NAME, payload, expected[PAYLOAD_NAME])
    return json.loads(payload)


def _check_sha256(path: pathlib.Path, data: bytes, expected: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise ValueError(
            f"corpus file {path} must have sha256 {expected} (from SHA256SUMS), got {digest}; "
            "rebuild it with `python scripts/build_corpus.py`"
        )


def split_documents(split: str) -> dict[str, str]:
    """{document name: text} of one split, sorted by name; the three splits partition the corpus."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    corpus = load_corpus()
    if split == "train":
        names = set(corpus) - set(VALIDATION_DOCS) - set(TEST_DOCS)
    else:
        names = _HELD_OUT[split]
    return {name: corpus[name] for name in sorted(names)}


def split_num_chars(split: str) -> int:
    """Characters in a split's documents (bos/eos add none), the denominator of bits per char."""
    return sum(len(text) for text in split_documents(split).values())


def write_split_files(split: str, directory: str | os.PathLike) -> list[pathlib.Path]:
    """Writes `<name>.txt` (UTF-8, text unchanged) per document of `split`; returns their paths."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in split_documents(split).items():
        path = directory / f"{name}.txt"
        # newline="" keeps "\n" as is on every platform.
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        paths.append(path)
    return paths


def token_stream(tokenizer: TextTokenizer, split: str) -> np.ndarray:
    """int32 [N]: each document of `split` as `bos + encode(text) + eos`, in sorted name order."""
    pieces = [
        [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
        for text in split_documents(split).values()
    ]
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in pieces])


def eval_windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """int32 [N, seq_len + 1] windows for validation loss, targets tiling the stream.

    Window i is `stream[i * seq_len : (i + 1) * seq_len + 1]`: consecutive windows share one token
    (the last target of one is the first input of the next), so with inputs `w[:, :-1]` and targets
    `w[:, 1:]` every token after the first is a target exactly once. The remainder, fewer than
    `seq_len` tokens at the end, is dropped (not scored).
    """
    stream = _check_stream(stream)
    seq_len = check_int("seq_len", seq_len, 1)
    num_windows = (len(stream) - 1) // seq_len
    if num_windows < 1:
        raise ValueError(
            f"stream must hold at least seq_len + 1 = {seq_len + 1} tokens, got {len(stream)}"
        )
    starts = np.arange(num_windows) * seq_len
    return stream[starts[:, None] + np.arange(seq_len + 1)]  # [N, seq_len + 1]


def token_windows(tokenizer: TextTokenizer, split: str, num: int, length: int) -> np.ndarray:
    """int32 [num, length]: windows of `length` tokens of the split's token stream, their starts
    evenly spaced from 0 to `N - length - 1` (rounded down; `N` the stream's length), so they
    cross document boundaries and the same arguments always give the same windows. The held-out
    prompts and evaluation windows of the speed and compression studies."""
    check_int("num", num, 1)
    check_int("length", length, 1)
    stream = token_stream(tokenizer, split)
    if len(stream) < length + 1:
        raise ValueError(f"length must be less than the {split} stream's {len(stream)} tokens, "
                         f"got {length}")
    starts = np.linspace(0, len(stream) - length - 1, num).astype(int)  # [num]
    return stream[starts[:, None] + np.arange(length)]  # [num, length]


class PackedBatches:
    """Training batches: the stream cut into non-overlapping windows of `seq_len + 1` tokens.

    Windows are shuffled per epoch: epoch e visits every window once, in a permutation drawn from
    (seed, e). The batches run through that order continuously, a batch may span two epochs, and
    the remainder of the stream (fewer than seq_len + 1 tokens) is never used. `batch(step)` depends
    only on (stream, batch_size, seq_len, seed, step), so a run resumed at step s sees the same data
    as one that never stopped (with the same NumPy: NEP 19 lets a feature release change the
    permutations `np.random.Generator` draws).
    """

    def __init__(self, stream: np.ndarray, batch_size: int, seq_len: int, seed: int):
        stream = _check_stream(stream)
        batch_size = check_int("batch_size", batch_size, 1)
        seq_len = check_int("seq_len", seq_len, 1)
        seed = check_int("seed", seed, 0)
        num_windows = len(stream) // (seq_len + 1)
        if num_windows < 1:
            raise ValueError(
                f"stream must hold at least one window of seq_len + 1 = {seq_len + 1} tokens, "
                f"got {len(stream)}"
            )
        # A copy: later in-place edits of the caller's array must not change the batches.
        windows = stream[: num_windows * (seq_len + 1)].reshape(num_windows, seq_len + 1)
        self._windows = windows.copy()  # [W, seq_len + 1]
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed

    @property
    def windows_per_epoch(self) -> int:
        return len(self._windows)

    def batch(self, step: int) -> np.ndarray:
        """int32 [B, seq_len + 1]: visits step * B .. (step + 1) * B - 1 of the window order."""
        step = check_int("step", step, 0)
        visit = step * self.batch_size + np.arange(self.batch_size)  # [B]
        epochs, positions = np.divmod(visit, self.windows_per_epoch)
        rows = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):
            in_epoch = epochs == epoch
            rows[in_epoch] = self.epoch_order(int(epoch))[positions[in_epoch]]
        return self._windows[rows]

    def epoch_order(self, epoch: int) -> np.ndarray:
        """int64 [windows_per_epoch]: the window indices in the order epoch `epoch` visits them."""
        epoch = check_int("epoch", epoch, 0)
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.windows_per_epoch)


def _check_stream(stream: np.ndarray) -> np.ndarray:
    array = np.asarray(stream)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"stream must be a 1-D array of token ids, got shape {array.shape} of {array.dtype}"
        )
    return array.astype(np.int32, copy=False)
