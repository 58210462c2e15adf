"""PretrainedTokenizer: a real model's tokenizer (``tokenizers``) with decodelab's interface.

It has what experiments use of ``decodelab.Tokenizer`` (``encode``, ``decode``, ``vocab_size``,
``id_to_piece``, ``bos_id``, ``eos_id``, ``pad_id``) plus the model's chat template. Its special
ids are the checkpoint's, not decodelab's fixed 0-3, and ``encode`` adds no special token unless
asked: ``add_bos`` puts the checkpoint's BOS first (``add_bos_by_default`` says whether the model
was trained to expect one).

Two sources build one: a Hugging Face ``tokenizer.json`` as it is, or a GGUF file's vocabulary
(``tokenizer.ggml.*``), rebuilt here the way llama.cpp tokenizes it: ``gpt2`` files are byte-level
BPE with the file's merges and the split rule of its ``pre`` name; ``llama`` files are
SentencePiece-style BPE over ``▁``-spelled pieces with byte fallback, merges ranked by score.
``token_bytes`` spells each id as bytes either way (what a constraint's automaton reads).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.optional import require
from decodelab.text.tokenizer import piece_bytes

# GGUF token types (llama.cpp's llama_token_type) that this module reads.
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

_SPACE = "\u2581"

# Llama 3's split rule (also llama.cpp's "llama-bpe"): contractions, words with one leading
# non-letter, numbers of up to 3 digits, punctuation runs, newlines, spaces.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_split():
    pre_tokenizers = require("tokenizers").pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_split():
    # Each digit alone, then GPT-2's rule (SmolLM's tokenizer.json, llama.cpp's "smollm").
    pre_tokenizers = require("tokenizers").pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=True)])


def _llama3_split():
    tokenizers = require("tokenizers")
    Regex, pre_tokenizers = tokenizers.Regex, tokenizers.pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=False)])


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the
    others (space, control bytes, ...) for the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()


def byte_level_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level BPE piece (``Ġthe``) stands for; None for a piece outside the
    alphabet, which no text spells."""
    try:
        return bytes(BYTE_LEVEL_ALPHABET[c] for c in piece)
    except KeyError:
        return None


def _decoder_kinds(backend) -> set[str]:
    """The ``type`` of the backend's decoder and of every decoder a Sequence of them holds."""
    found, todo = set(), [json.loads(backend.decoder.__getstate__())] if backend.decoder else []
    while todo:
        decoder = todo.pop()
        found.add(decoder.get("type"))
        todo += decoder.get("decoders", [])
    return found


# GGUF `tokenizer.ggml.pre` -> the split rule of a byte-level BPE vocabulary.
BYTE_LEVEL_SPLITS = {"default": _gpt2_split, "gpt-2": _gpt2_split, "smollm": _smollm_split,
                     "llama-bpe": _llama3_split, "llama3": _llama3_split,
                     "llama-v3": _llama3_split}


class PretrainedTokenizer:
    """A ``tokenizers.Tokenizer`` with its special ids and chat template; build one with
    ``from_gguf_metadata`` or ``from_hf_directory`` (``decodelab.convert``)."""

    def __init__(self, backend, *, bos_id: int | None, eos_id: int | None,
                 pad_id: int | None = None, unk_id: int | None = None,
                 add_bos_by_default: bool = False, chat_template: str | None = None):
        self._tok = backend
        size = backend.get_vocab_size(with_added_tokens=True)
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id),
                            ("unk_id", unk_id)):
            if value is not None and not (isinstance(value, int) and 0 <= value < size):
                raise ValueError(f"{name} must be None or an id in [0, {size}), got {value!r}")
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.add_bos_by_default = add_bos_by_default
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def token_bytes(self) -> list[bytes | None]:
        """``[vocab_size]``: the bytes each id stands for in a decoded text, None for special
        tokens (and ids the vocabulary skips). Byte-level vocabularies (a ``ByteLevel`` decoder,
        as SmolLM2's) spell pieces in GPT-2's alphabet, so a piece may be part of a UTF-8
        character; the others are SentencePiece-style (``piece_bytes``). Added tokens that are
        not special stand for their text."""
        spell = byte_level_bytes if "ByteLevel" in _decoder_kinds(self._tok) else piece_bytes
        added = self._tok.get_added_tokens_decoder()
        spelled: list[bytes | None] = [None] * self.vocab_size
        for piece, i in self._tok.get_vocab(with_added_tokens=True).items():
            token = added.get(i)
            if token is None:
                spelled[i] = spell(piece)
            elif not token.special:
                spelled[i] = token.content.encode("utf-8")
        return spelled

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text`` (special-token strings in it, e.g. ``<|im_start|>``, become their
        ids), optionally wrapped in the checkpoint's BOS ... EOS."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        for name, flag, token_id in (("add_bos", add_bos, self.bos_id),
                                     ("add_eos", add_eos, self.eos_id)):
            if flag and token_id is None:
                raise ValueError(f"{name}=True needs a tokenizer with a {name[4:]} token, this one "
                                 "has none")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids`` (1-D, each in [0, vocab_size)); special tokens decode to nothing."""
        array = np.asarray(ids)
        if array.size == 0:
            return ""
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"ids must be a 1-D sequence of ints, got shape {array.shape} of "
                             f"{array.dtype}")
        if array.min() < 0 or array.max() >= self.vocab_size:
            bad = array[(array < 0) | (array >= self.vocab_size)]
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {bad.tolist()}")
        return self._tok.decode(array.tolist(), skip_special_tokens=True)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            raise ValueError(f"token_id must be in [0, {self.vocab_size}), got {token_id!r}")
        return piece

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *,
                            add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation (``[{"role": ..., "content": ...}, ...]``) under the
        checkpoint's Jinja chat template, as Hugging Face renders it; encode it with ``encode``
        (the template writes its own special tokens)."""
        if self.chat_template is None:
            raise ValueError("apply_chat_template needs a checkpoint with a chat template, this "
                             "tokenizer has none")
        if isinstance(messages, (str, bytes)) or not all(
                isinstance(m, Mapping) and "role" in m and "content" in m for m in messages):
            raise ValueError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                             f"got {messages!r}")
        ImmutableSandboxedEnvironment = require("jinja2.sandbox").ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise ValueError(f"the chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        piece = lambda i: None if i is None else self.id_to_piece(i)  # noqa: E731
        return env.from_string(self.chat_template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=piece(self.bos_id) or "", eos_token=piece(self.eos_id) or "")

    def to_json(self) -> str:
        """Everything that defines this tokenizer as one JSON string (``from_json`` inverts it):
        checkpoints embed it, and its hash identifies the tokenizer in cache keys."""
        return json.dumps({"backend": self._tok.to_str(), "bos_id": self.bos_id,
                           "eos_id": self.eos_id, "pad_id": self.pad_id, "unk_id": self.unk_id,
                           "add_bos_by_default": self.add_bos_by_default,
                           "chat_template": self.chat_template}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PretrainedTokenizer:
        """The tokenizer of a ``to_json`` string."""
        Tokenizer = require("tokenizers").Tokenizer

        try:
            fields = json.loads(text)
            backend = Tokenizer.from_str(fields.pop("backend"))
            return cls(backend, **fields)
        except Exception as e:  # the JSON, its fields or the backend's own parser
            raise ValueError(f"text must be a PretrainedTokenizer.to_json string, got one that "
                             f"fails to load ({type(e).__name__}: {e})") from None

    def __repr__(self) -> str:
        return (f"PretrainedTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id})")


def _sentencepiece_merges(pieces: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a piece into two pieces,
    the best-scored result first (SentencePiece BPE scores a piece by minus its merge rank)."""
    index = {piece: i for i, piece in enumerate(pieces)}
    candidates = []
    for piece, score in zip(pieces, scores):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                candidates.append((-score, index[left], index[right], left, right))
    candidates.sort()
    return [(left, right) for *_, left, right in candidates]


def from_gguf_metadata(fields: Mapping[str, Any], source: str) -> PretrainedTokenizer:
    """The tokenizer a GGUF file describes; ``fields`` maps its ``tokenizer.*`` keys to values,
    ``source`` names the file in errors."""
    tokenizers = require("tokenizers")
    AddedToken, Tokenizer = tokenizers.AddedToken, tokenizers.Tokenizer
    decoders, models, normalizers = tokenizers.decoders, tokenizers.models, tokenizers.normalizers

    kind = fields.get("tokenizer.ggml.model")
    tokens = list(fields.get("tokenizer.ggml.tokens", []))
    if not tokens:
        raise ValueError(f"{source} must hold a vocabulary (tokenizer.ggml.tokens), got none")
    types = list(fields.get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens)))
    if kind == "gpt2":
        pre = fields.get("tokenizer.ggml.pre", "default")
        if pre not in BYTE_LEVEL_SPLITS:
            raise ValueError(f"{source}: tokenizer.ggml.pre must be one of "
                             f"{sorted(BYTE_LEVEL_SPLITS)} for a byte-level BPE vocabulary, got "
                             f"{pre!r}")
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        backend.pre_tokenizer = BYTE_LEVEL_SPLITS[pre]()
        backend.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = list(fields.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
        unk = fields.get("tokenizer.ggml.unknown_token_id")
        backend = Tokenizer(models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=_sentencepiece_merges(tokens, scores),
            unk_token=None if unk is None else tokens[unk], fuse_unk=True, byte_fallback=True))
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        backend.normalizer = normalizers.Sequence(
            ([normalizers.Prepend(_SPACE)] if prefix else [])
            + [normalizers.Replace(" ", _SPACE)])
        backend.decoder = decoders.Sequence(
            [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    else:
        raise ValueError(f"{source}: tokenizer.ggml.model must be 'gpt2' (byte-level BPE) or "
                         f"'llama' (SentencePiece-style), got {kind!r}")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types) if k == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types) if k == _USER_DEFINED])
    ids = {name: fields.get(f"tokenizer.ggml.{key}") for name, key in (
        ("bos_id", "bos_token_id"), ("eos_id", "eos_token_id"), ("pad_id", "padding_token_id"),
        ("unk_id", "unknown_token_id"))}
    return PretrainedTokenizer(
        backend, **{k: None if v is None else int(v) for k, v in ids.items()},
        add_bos_by_default=bool(fields.get("tokenizer.ggml.add_bos_token", kind == "llama")),
        chat_template=fields.get("tokenizer.chat_template"))


def from_hf_directory(directory, model_config: Mapping[str, Any]) -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face checkpoint directory: ``tokenizer.json``, with special
    tokens and the chat template from ``tokenizer_config.json`` (or ``chat_template.jinja``) and
    special ids ``config.json`` gives where those do not."""
    Tokenizer = require("tokenizers").Tokenizer

    directory = pathlib.Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"directory must hold a tokenizer.json, got none in {str(directory)!r}")
    backend = Tokenizer.from_file(str(path))
    settings_path = directory / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}

    def special_id(name: str) -> int | None:
        token = settings.get(f"{name}_token")
        if isinstance(token, Mapping):
            token = token.get("content")
        if isinstance(token, str) and backend.token_to_id(token) is not None:
            return backend.token_to_id(token)
        value = model_config.get(f"{name}_token_id")
        return value[0] if isinstance(value, list) and value else value

    template = settings.get("chat_template")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    return PretrainedTokenizer(
        backend, bos_id=special_id("bos"), eos_id=special_id("eos"), pad_id=special_id("pad"),
        unk_id=special_id("unk"), add_bos_by_default=bool(settings.get("add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None)
