"""Speculative decoding: the loop state and proposals (``state``), the drafters, one
draft/verify/accept round (``rounds``) and ``speculative_generate`` with its options
(``generation``)."""

from decodelab.speculative.drafters import Drafter, ModelDrafter, NgramDrafter
from decodelab.speculative.generation import (SpeculativeOptions, SpeculativeOutput,
                                              SpeculativeStats, expected_tokens_per_call,
                                              predicted_speedup, speculative_generate)
from decodelab.speculative.rounds import speculative_round, verify
from decodelab.speculative.state import Proposal, SpecState, stream_keys

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "Proposal", "SpecState", "SpeculativeOptions",
           "SpeculativeOutput", "SpeculativeStats", "expected_tokens_per_call", "predicted_speedup",
           "speculative_generate", "speculative_round", "stream_keys", "verify"]
