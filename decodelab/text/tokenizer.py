"""Tokenizer: SentencePiece BPE or unigram with fixed special ids and byte fallback.

What every caller may rely on:

- Ids 0-3 are `<pad>`, `<unk>`, `<s>`, `</s>` (PAD_ID, UNK_ID, BOS_ID, EOS_ID), ids 4-259 are the
  256 byte pieces `<0x00>`..`<0xFF>`, learned pieces follow, up to `vocab_size - 1`.
- Any str of valid Unicode round-trips: `decode(encode(s)) == s`. Normalization is the identity, no
  dummy prefix is added and whitespace is kept as it is; a character without a piece of its own is
  spelled as its UTF-8 bytes (byte fallback), so `encode` never produces `<unk>`.
- Training reads each file as lines, so newline is never a learned piece: it is the byte `<0x0A>`
  (as in Llama). Spaces become `▁` and start the piece that follows them; a literal `▁` in the text
  is encoded as its three UTF-8 bytes.
- ``token_bytes()`` spells each id as the bytes it stands for (``▁`` as a space, a byte piece as its
  byte; None for the special ids): what a constraint's automaton matches a pattern against.
- Training is deterministic: the same files and arguments give the same model bytes. The unigram
  result depends on `num_threads` (partial sums are combined per thread), hence its fixed default.
"""

from __future__ import annotations

import io
import os
import pathlib
import random
import re
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from decodelab.checks import check_int, check_path

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
NUM_SPECIAL = 4
NUM_BYTES = 256
# Specials plus one piece per byte; SentencePiece also needs one piece per distinct character of the
# training text, so the real minimum for a given corpus is higher (reported when training fails).
MIN_VOCAB_SIZE = NUM_SPECIAL + NUM_BYTES
MODEL_TYPES = ("bpe", "unigram")

_SPACE_SYMBOL = "\u2581"
_SPACE_SYMBOL_IDS = [NUM_SPECIAL + byte for byte in _SPACE_SYMBOL.encode("utf-8")]
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)")
_TOO_LARGE = re.compile(r"Vocabulary size (?:is )?too high .*set it to a value <= (\d+)")


class Tokenizer:
    """A trained SentencePiece model. Build one with `train`, `load` or `from_serialized`."""

    pad_id = PAD_ID
    unk_id = UNK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    def __init__(self, processor: spm.SentencePieceProcessor):
        specials = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"processor must have pad/unk/bos/eos ids {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}, "
                f"got {specials}"
            )
        byte_ids = range(NUM_SPECIAL, MIN_VOCAB_SIZE)
        if processor.vocab_size() < MIN_VOCAB_SIZE or not all(map(processor.is_byte, byte_ids)):
            raise ValueError(
                f"processor must have byte pieces at ids {NUM_SPECIAL}..{MIN_VOCAB_SIZE - 1} "
                "(byte fallback), got a model without them"
            )
        self._sp = processor

    @classmethod
    def train(
        cls,
        files: Iterable[str | os.PathLike],
        vocab_size: int,
        model_type: str = "bpe",
        *,
        num_threads: int = 2,
        max_sentences: int = 1_000_000,
        seed: int = 0,
    ) -> Tokenizer:
        """Trains a tokenizer on UTF-8 text files, in memory (no files are written).

        Each line of each file is one training sentence. If there are more than `max_sentences`
        non-empty lines, a random subset of that many is used, drawn with `seed`; otherwise `seed`
        has no effect. `num_threads` changes the unigram result (see the module docstring).
        """
        if isinstance(files, (str, bytes, os.PathLike)) or not isinstance(files, Iterable):
            raise ValueError(f"files must be an iterable of paths, got {files!r}")
        files = [pathlib.Path(f) for f in files]
        if not files:
            raise ValueError("files must name at least one file, got []")
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"files must all exist, got missing {missing}")
        check_int("vocab_size", vocab_size, MIN_VOCAB_SIZE)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        check_int("num_threads", num_threads, 1)
        check_int("max_sentences", max_sentences, 1)
        check_int("seed", seed, 0)

        lines = [line for f in files for line in _read_utf8(f).split("\n") if line]
        if not any(line.strip() for line in lines):
            raise ValueError(
                f"files must contain non-whitespace text, got none in {[str(f) for f in files]}"
            )
        if len(lines) > max_sentences:
            lines = random.Random(seed).sample(lines, max_sentences)

        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                byte_fallback=True,
                normalization_rule_name="identity",
                add_dummy_prefix=False,
                remove_extra_whitespaces=False,
                # Every character seen in training gets a piece; unseen ones fall back to bytes.
                character_coverage=1.0,
                # Longer lines would be dropped silently; this length keeps every line.
                max_sentence_length=max(len(line.encode("utf-8")) for line in lines) + 1,
                num_threads=num_threads,
                train_extremely_large_corpus=False,
                minloglevel=2,
            )
        except RuntimeError as e:
            if match := _TOO_SMALL.search(str(e)):
                raise ValueError(
                    f"vocab_size must be >= {match.group(1)} for these files ({MIN_VOCAB_SIZE} "
                    f"specials and bytes + one piece per distinct character), got {vocab_size}"
                ) from None
            if match := _TOO_LARGE.search(str(e)):
                raise ValueError(
                    f"vocab_size must be <= {match.group(1)} for these files (the most pieces "
                    f"the text supports), got {vocab_size}"
                ) from None
            raise
        return cls.from_serialized(model.getvalue())

    @classmethod
    def from_serialized(cls, serialized_model: bytes) -> Tokenizer:
        """Inverse of `serialized_model`: builds a tokenizer from SentencePiece model bytes."""
        if not isinstance(serialized_model, bytes):
            raise ValueError(
                f"serialized_model must be bytes, got {type(serialized_model).__name__}"
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(serialized_model)
        except RuntimeError:
            raise ValueError(
                f"serialized_model must be a SentencePiece model, got {len(serialized_model)} "
                "bytes that do not parse as one"
            ) from None
        return cls(processor)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Reads a model written by `save` (a standard SentencePiece `.model` file)."""
        path = check_path("path", path, "file", what="tokenizer model ")
        return cls.from_serialized(path.read_bytes())

    def save(self, path: str | os.PathLike) -> None:
        """Writes the model to the file ``path`` (its folder is created if needed)."""
        check_path("path", path, "file", write=True).write_bytes(self.serialized_model())

    def serialized_model(self) -> bytes:
        """The SentencePiece ModelProto bytes; all a checkpoint needs to rebuild this tokenizer."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def id_to_piece(self, token_id: int) -> str:
        (token_id,) = self._check_ids("token_id", [token_id])
        return self._sp.id_to_piece(token_id)

    def token_bytes(self) -> list[bytes | None]:
        """``[vocab_size]``: the bytes each id stands for in a decoded text (``piece_bytes``),
        None for pad, unk, bos and eos, which no text spells."""
        sp = self._sp
        return [None if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)
                else piece_bytes(sp.id_to_piece(i)) for i in range(sp.vocab_size())]

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text`, optionally wrapped in BOS_ID ... EOS_ID."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"text must be valid Unicode, got lone surrogate {text[e.start]!r} at index "
                    f"{e.start}"
                ) from None
        # SentencePiece writes a space as "▁" and decodes every "▁" piece back to a space, so a
        # literal "▁" in the text would come back as " ": it is spelled as its UTF-8 bytes, which
        # decode as is.
        # (Not the batch call encode(list): its thread pool costs ~20x on short texts.)
        segments = [self._sp.encode(segment) for segment in text.split(_SPACE_SYMBOL)]
        ids = [BOS_ID] if add_bos else []
        ids += segments[0]
        for segment in segments[1:]:
            ids += _SPACE_SYMBOL_IDS
            ids += segment
        if add_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of `ids` (1-D, each in [0, vocab_size)).

        Pad, bos and eos decode to nothing; `<unk>` (never produced by `encode`) to " \u2047 ".
        """
        ids = self._check_ids("ids", ids)
        return self._sp.decode(ids)

    def _check_ids(self, name: str, ids) -> list[int]:
        array = np.asarray(ids)
        if array.ndim == 1 and array.size == 0:
            return []
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"{name} must be a 1-D sequence of ints, got shape {array.shape} of {array.dtype}"
            )
        if array.min() < 0 or array.max() >= self.vocab_size:
            bad = array[(array < 0) | (array >= self.vocab_size)]
            raise ValueError(f"{name} must be in [0, {self.vocab_size}), got {bad.tolist()}")
        return array.tolist()

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def piece_bytes(piece: str) -> bytes:
    """The bytes a SentencePiece-style piece stands for: a byte-fallback piece ``<0x41>`` its
    byte, any other piece its UTF-8 with ``▁`` as a space."""
    if match := _BYTE_PIECE.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    return piece.replace(_SPACE_SYMBOL, " ").encode("utf-8")


def _read_utf8(path: pathlib.Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"files must be UTF-8 text, got {str(path)!r}: {e}") from None
