"""Sampling: ``SamplingParams`` and the per-row keys; what a processor reads (``inputs``); the
processor interface (``base``), the processors (``penalties``, ``truncation``, ``mirostat``)
and their registry (``processors``, with ``RowParams``); DRY's sequence breakers (``breakers``);
sort-free cuts and the draw (``select``); the exact distribution and draw (``params``);
structured output: the patterns a caller gives (``patterns``) and the table of their automata
the loops read (``constraint``)."""

from decodelab.sampling.base import LogitsProcessor, argmax, entropy, logprob_entropy, probs
from decodelab.sampling.inputs import History, Parameter
from decodelab.sampling.params import (SamplingParams, all_greedy, bad_logits, batch_keys, draw,
                                       greedy_choice, greedy_scores, indexed_sample_keys,
                                       process_logits,
                                       processed_logprobs, row_keys, sample_keys, seed_keys,
                                       usable)
from decodelab.sampling.processors import HISTORY_PARAMETERS, PARAMETERS, PROCESSORS, RowParams

__all__ = ["HISTORY_PARAMETERS", "History", "LogitsProcessor", "PARAMETERS", "PROCESSORS",
           "Parameter", "RowParams", "SamplingParams", "all_greedy", "argmax", "bad_logits",
           "batch_keys", "draw", "entropy", "greedy_choice", "greedy_scores",
           "indexed_sample_keys", "logprob_entropy",
           "probs", "process_logits", "processed_logprobs", "row_keys", "sample_keys", "seed_keys",
           "usable"]
