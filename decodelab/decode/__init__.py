"""Decoding: request checks and output types (``request``), the compiled loop (``loop``),
``generate`` (``generation``) and beam search (``beam``)."""

from decodelab.decode.beam import BeamSearchOutput, beam_search
from decodelab.decode.generation import DecodeState, generate, greedy
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.request import FINISH_REASONS, PAD_TOKEN, GenerateOutput, bucket_length

__all__ = ["BeamSearchOutput", "CompiledLoop", "DecodeState", "FINISH_REASONS", "GenerateOutput",
           "PAD_TOKEN", "beam_search", "bucket_length", "generate", "greedy"]
