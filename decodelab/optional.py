"""Optional dependencies: importing one that is missing says which extra installs it and why.

The core (model, decoding, training, experiments) needs only the packages in ``dependencies``; a
few features need more, grouped in pyproject.toml's extras. Every import of such a package goes
through ``require``, so a missing one is a ``MissingExtra`` (a ``ModuleNotFoundError``, caught as
any ImportError is) whose message names the package, the feature that needs it and the command
that installs it, instead of a bare ``No module named 'gguf'``.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType


@dataclasses.dataclass(frozen=True)
class Extra:
    """Where an optional package comes from and what needs it."""

    # The pyproject.toml extra that installs it (``pip install -e .[<extra>]``).
    extra: str
    # Its name on PyPI (``pip install <distribution>``).
    distribution: str
    # What needs it, completing "... needs <distribution>".
    needed_by: str


# Top-level module name -> where it comes from. A package used anywhere in decodelab is listed here.
OPTIONAL = {
    "gguf": Extra("real", "gguf", "reading GGUF files (load_gguf, gguf_tokenizer)"),
    "tokenizers": Extra("real", "tokenizers", "a pretrained model's tokenizer "
                                              "(PretrainedTokenizer, from GGUF or Hugging Face)"),
    "jinja2": Extra("real", "jinja2", "rendering a chat template (apply_chat_template)"),
    "safetensors": Extra("real", "safetensors", "reading a Hugging Face checkpoint (load_hf)"),
    "torch": Extra("peer", "torch", "the PyTorch peer of the decode benchmark"),
    "transformers": Extra("peer", "transformers", "the transformers peer of the decode benchmark"),
    "llama_cpp": Extra("llamacpp", "llama-cpp-python", "the llama.cpp peer of the decode benchmark"),
    "qwix": Extra("quant", "qwix", "quantizing weights with qwix rules (quantize)"),
    "outlines_core": Extra("structured", "outlines-core",
                           "compiling a regex or JSON-schema constraint (sampling.automaton)"),
}


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed; the message says how to install it."""


def require(module: str) -> ModuleType:
    """``import module`` for an optional package listed in ``OPTIONAL`` (``"gguf.quants"``
    imports that submodule); raises ``MissingExtra`` naming the extra to install if the package
    is missing."""
    top = module.partition(".")[0]
    if top not in OPTIONAL:
        raise ValueError(f"module must be an optional package of {sorted(OPTIONAL)} (or one of "
                         f"their submodules), got {module!r}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.partition(".")[0] != top:
            raise  # the package is there but one of its own dependencies is not: its error says so
        spec = OPTIONAL[top]
        raise MissingExtra(
            f"{spec.needed_by} needs the optional package {spec.distribution!r}, which is not "
            f"installed: pip install -e '.[{spec.extra}]' (or pip install {spec.distribution})",
            name=top) from None
