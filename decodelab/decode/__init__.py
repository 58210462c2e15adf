"""Decoding: request checks and options (``request``), the buckets of a call (``shapes``), the
output (``output``; beam search's in ``beam_output``), the state every loop carries (``state``),
the compiled loop (``loop``), the cache a call starts from (``caches``), ``generate``
(``generation``), classifier-free guidance and DoLa in it (options: ``guide``; the step's
scores: ``scoring``), beam search (``beam``) and contrastive search (``contrastive``)."""

from decodelab.decode.beam import BeamSearchOutput, beam_search
from decodelab.decode.contrastive import contrastive_search
from decodelab.decode.generation import DecodeState, generate, greedy
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.output import GenerateOutput
from decodelab.decode.request import (FINISH_REASONS, PAD_TOKEN, BeamOptions, DecodeOptions,
                                      OutputSpec, bucket_length)
from decodelab.decode.state import LoopState, RowState

__all__ = ["BeamOptions", "BeamSearchOutput", "CompiledLoop", "DecodeOptions", "DecodeState",
           "FINISH_REASONS", "GenerateOutput", "LoopState", "OutputSpec", "PAD_TOKEN", "RowState",
           "beam_search", "bucket_length", "contrastive_search", "generate", "greedy"]
