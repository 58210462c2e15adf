"""Real checkpoints: GGUF files and Hugging Face directories -> (Transformer, tokenizer).

``torch`` is never needed; each format's reader (``gguf``, ``safetensors``, ``tokenizers``,
``jinja2`` for chat templates) is imported when a file of that format is loaded (the ``real``
extra installs them).
"""

from decodelab.convert.from_gguf import gguf_model_config, gguf_tokenizer, load_gguf
from decodelab.convert.hf import load_hf
from decodelab.convert.tokenizer import PretrainedTokenizer

__all__ = ["PretrainedTokenizer", "gguf_model_config", "gguf_tokenizer", "load_gguf", "load_hf"]
