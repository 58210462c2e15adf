"""The serving engine's request, completion and step-result types (``engine`` module docstring)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from decodelab.checks import INT32_MAX, check_size
from decodelab.decode.request import check_seed, token_ids
from decodelab.sampling.params import SamplingParams
from decodelab.serving.options import EngineOptions


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    """One serving request: what ``generate`` would get for a single prompt, with an id and an
    arrival time; its ``n`` samples take a slot each and draw as ``generate(..., n=n)``'s
    (``serving.samples``; results keyed by ``sample_key``). (``decode.request.BatchRequest`` is
    a validated batch call; the fields the two share are checked by the same functions, the
    vocabulary by ``SlotEngine.check``.)"""

    id: int | str
    prompt: tuple[int, ...]  # token ids
    max_new_tokens: int  # the output budget
    params: SamplingParams = dataclasses.field(default_factory=SamplingParams.greedy)
    seed: int = 0
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    arrival: float = 0.0  # seconds after the start of its trace
    n: int = 1  # samples of the prompt, each in its own slot (one prefill on paged memory)

    def __post_init__(self) -> None:
        if not isinstance(self.id, (int, str)) or isinstance(self.id, bool):
            raise ValueError(f"id must be an int or a str, got {self.id!r}")
        # The vocabulary is the engine's (``SlotEngine.check``); here ids need only fit the
        # int32 arrays they go into.
        prompt = token_ids("prompt", self.prompt, INT32_MAX + 1)
        object.__setattr__(self, "prompt", tuple(prompt.tolist()))
        check_size("max_new_tokens", self.max_new_tokens, 1)
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {self.params!r}")
        check_seed("seed", self.seed)
        if isinstance(self.stop_sequences, (str, bytes)) or not isinstance(
                self.stop_sequences, Sequence):
            raise ValueError(f"stop_sequences must be a list of token-id lists, got "
                             f"{self.stop_sequences!r}")
        stops = tuple(tuple(token_ids(f"stop_sequences[{i}]", s, INT32_MAX + 1).tolist())
                      for i, s in enumerate(self.stop_sequences))
        object.__setattr__(self, "stop_sequences", stops)
        if isinstance(self.arrival, bool) or not isinstance(self.arrival, (int, float)) or not (
                np.isfinite(self.arrival) and self.arrival >= 0):
            raise ValueError(f"arrival must be a finite number of seconds >= 0, got "
                             f"{self.arrival!r}")
        check_size("n", self.n, 1)

    @property
    def keys(self) -> list[int | str | tuple[int | str, int]]:
        """Its samples' keys in order (``sample_key``)."""
        return [sample_key(self.id, i, self.n) for i in range(self.n)]


def sample_key(request_id: int | str, sample: int, n: int) -> int | str | tuple[int | str, int]:
    """The key of sample ``sample`` of a request of ``n`` samples in ``SlotEngine.run``'s results,
    ``StepResult``'s dicts and ``replay``'s records: the request's id when ``n == 1``, else
    ``(id, sample)`` (an id is an int or a str, never a tuple, so keys never collide)."""
    return request_id if n == 1 else (request_id, sample)


def stops_refused(request: Request, options: EngineOptions, vocab_size: int) -> str | None:
    """Why ``request``'s stop sequences do not fit an engine's room for them
    (``EngineOptions.max_stop_sequences`` of at most ``max_stop_width`` ids in ``vocab_size``),
    or None."""
    if len(request.stop_sequences) > options.max_stop_sequences:
        return (f"{len(request.stop_sequences)} stop sequences, the engine has room for "
                f"max_stop_sequences={options.max_stop_sequences}")
    for m, s in enumerate(request.stop_sequences):
        if len(s) > options.max_stop_width:
            return (f"stop sequence {list(s)} must have <= max_stop_width="
                    f"{options.max_stop_width} ids")
        try:
            token_ids(f"stop_sequences[{m}]", s, vocab_size)
        except ValueError as error:
            return str(error)
    return None


def check_unique_ids(requests: Sequence[Request], decoding: Iterable[Request]) -> None:
    """Raise ValueError naming the ids that ``requests`` and the requests ``decoding`` (one
    entry per slot: a request of n samples n times) hold more than once: a repeated id would
    lose a completion."""
    held = {id(r): r for r in decoding}.values()
    ids = collections.Counter([r.id for r in requests] + [r.id for r in held])
    repeated = sorted((i for i, count in ids.items() if count > 1), key=str)
    if repeated:
        raise ValueError(f"request ids must be unique, got {repeated} more than once (among "
                         f"requests and the requests decoding); a repeated id would lose a "
                         f"completion")


@dataclasses.dataclass(frozen=True, eq=False)
class Completion:
    """A retired request's output (the fields of one row of ``GenerateOutput``)."""

    request_id: int | str
    slot: int
    tokens: list[int]  # the output only
    logprobs: np.ndarray  # [n] float32, each token's log-prob under its sampling distribution
    finish_reason: str  # "eos" | "stop" | "length" | "error"
    cached_tokens: int = 0  # leading tokens its (last) prefill took from the prefix cache
    sample: int = 0  # which of its request's samples (0 is the n=1 output)
    key: int | str | tuple[int | str, int] = None  # ``sample_key``; default the request id

    def __post_init__(self) -> None:
        if self.key is None:
            object.__setattr__(self, "key", self.request_id)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one ``step`` call did."""

    # Keyed by ``sample_key`` (the request id unless it has n > 1 samples):
    generated: dict[int | str, int]  # output tokens so far, per sample running or finished
    tokens: dict[int | str, list[int]]  # the output tokens this call produced, per sample
    finished: list[Completion]  # retired by this call, their slots already free
    rounds: int  # decode rounds run (<= n; fewer once no slot was running)
    # Requests this call took out of their slots for lack of pages (paged memory), in admission
    # order: insert each again (before newer requests) to resume it.
    preempted: list[Request] = dataclasses.field(default_factory=list)
