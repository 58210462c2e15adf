"""The slot engine's rarer arguments, grouped: what every request shares, the room the engine
keeps for what each request brings and how it prefills (``engine``
module docstring)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from decodelab.checks import check_size, is_int


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The rarer arguments of ``SlotEngine`` (``SlotEngine`` says what each does), checked here;
    each ValueError names the field. What depends on the model is the engine's to check: the
    ids within its vocabulary, ``prefill_chunk`` within ``max_len``."""

    eos_ids: int | Sequence[int] = ()  # ids that end any request (finish reason "eos")
    max_stop_sequences: int = 4  # room for each request's own stop sequences ...
    max_stop_width: int = 8  # ... of at most this many ids each
    prefill_chunk: int | None = None  # None: whole prompts; C: at most C tokens per call
    tokenizer: Any = None  # the model's; ids past its size (a padded vocabulary's) never sampled;
    #   what a request's regex / json_schema is compiled over

    def __post_init__(self) -> None:
        ids = [self.eos_ids] if is_int(self.eos_ids) else self.eos_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
            raise ValueError(f"eos_ids must be an int or a list of ints, got {self.eos_ids!r}")
        for i in ids:
            if not is_int(i) or i < 0:
                raise ValueError(f"eos_ids must be token ids (ints >= 0), got {i!r}")
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in ids))
        object.__setattr__(self, "max_stop_sequences",
                           check_size("max_stop_sequences", self.max_stop_sequences, 0))
        object.__setattr__(self, "max_stop_width",
                           check_size("max_stop_width", self.max_stop_width, 1))
        chunk = self.prefill_chunk
        if chunk is not None and (not is_int(chunk) or chunk < 1):
            raise ValueError(f"prefill_chunk must be None (whole prompts) or an int >= 1, got "
                             f"{chunk!r}")
        object.__setattr__(self, "prefill_chunk", None if chunk is None else int(chunk))
