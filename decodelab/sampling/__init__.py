"""Sampling: ``SamplingParams`` and the per-row keys; what a processor reads (``inputs``); the
processor interface (``base``), the processors (``penalties``, ``truncation``, ``mirostat``)
and their registry (``processors``, with ``RowParams``); DRY's sequence breakers (``breakers``);
sort-free cuts and the draw (``select``); parameters, keys and the exact draw (``params``);
the distribution through the processors and the greedy choice (``distribution``);
structured output: the patterns a caller gives (``patterns``) and the table of their automata
the loops read (``constraint``)."""

from decodelab.sampling.base import LogitsProcessor, argmax, entropy, logprob_entropy, probs
from decodelab.sampling.inputs import History, Parameter
from decodelab.sampling.distribution import (Scored, all_greedy, bad_logits, greedy_choice,
                                             greedy_scores, process_logits, process_scores,
                                             processed_logprobs, score)
from decodelab.sampling.params import (SamplingParams, batch_keys, draw, draw_with_total,
                                       indexed_sample_keys, row_keys, sample_keys, seed_keys)
from decodelab.sampling.processors import HISTORY_PARAMETERS, PARAMETERS, PROCESSORS, RowParams

__all__ = ["HISTORY_PARAMETERS", "History", "LogitsProcessor", "PARAMETERS", "PROCESSORS",
           "Parameter", "RowParams", "SamplingParams", "Scored", "all_greedy", "argmax",
           "bad_logits", "batch_keys", "draw", "draw_with_total", "entropy", "greedy_choice",
           "greedy_scores", "indexed_sample_keys", "logprob_entropy", "probs", "process_logits",
           "process_scores", "processed_logprobs", "row_keys", "sample_keys", "score",
           "seed_keys"]
