"""Sampling: ``SamplingParams`` and the per-row keys; what a processor reads (``inputs``); the
processor interface (``base``), the processors (``penalties``, ``truncation``) and their registry
(``processors``, with ``RowParams``); the exact draw (``params``)."""

from decodelab.sampling.base import (LogitsProcessor, argmax, entropy, exclusive_cumsum,
                                     logprob_entropy, probs)
from decodelab.sampling.inputs import CANDIDATES, History, Parameter, Plan
from decodelab.sampling.params import (SamplingParams, bad_logits, batch_keys, draw, greedy_choice,
                                       greedy_scores, process_logits, processed_logprobs, row_keys,
                                       sample_tokens, seed_keys, usable)
from decodelab.sampling.processors import (HISTORY_PARAMETERS, PARAMETERS, PROCESSORS, RowParams,
                                           planned, union)

__all__ = ["CANDIDATES", "HISTORY_PARAMETERS", "History", "LogitsProcessor", "PARAMETERS",
           "PROCESSORS", "Parameter", "Plan", "RowParams", "SamplingParams", "argmax", "bad_logits",
           "batch_keys", "draw", "entropy", "exclusive_cumsum", "greedy_choice", "greedy_scores",
           "logprob_entropy", "planned", "probs", "process_logits", "processed_logprobs",
           "row_keys", "sample_tokens", "seed_keys", "union", "usable"]
