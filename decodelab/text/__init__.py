"""Text: the tokenizer (BPE or unigram, sentencepiece) and the bundled corpus with its splits,
token streams and batches."""

from decodelab.text.data import (PackedBatches, eval_windows, load_corpus, split_documents,
                                 token_stream)
from decodelab.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "PackedBatches", "Tokenizer", "UNK_ID", "eval_windows",
           "load_corpus", "split_documents", "token_stream"]
