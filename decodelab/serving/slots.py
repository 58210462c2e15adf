"""What the host holds of one occupied slot of a ``SlotEngine`` (``engine`` module docstring).

A slot's request prefills its ``sequence`` (its prompt, then the tokens it had generated before a
preemption) and then decodes; the host keeps the output tokens and log-probs received so far (the
device state is read once per engine call) and, while it prefills, how much of the sequence is
in the cache. A preempted slot's record is kept until its request is inserted again, which
resumes from its tokens. A slot holds one sample of its request (``Request.n``). On paged memory
a slot may *wait* for a *leader* (another slot, sample 0 of its request or a request prefilling
the same prefix): it holds no page and prefills nothing until the leader's cache holds the
prefix they share, then shares those pages (``samples``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from decodelab import sampling
from decodelab.decode.request import FINISH_REASONS
from decodelab.serving.requests import Completion, Request, sample_key


def tokens_after_call(request: Request, sequence: int, prefilled: int, chunk: int | None,
                      rounds: int) -> int:
    """Cache slots ``request`` holds after the next call, with ``prefilled`` of the ``sequence``
    tokens it prefills already in: its next prefill chunk (at most ``chunk`` tokens; None: the
    rest) and, once that completes its prefill, the call's decode ``rounds`` (at most its whole
    length, prompt + ``max_new_tokens``)."""
    filled = prefilled + min(sequence - prefilled, chunk or sequence)
    grown = rounds if filled >= sequence else 0
    return min(filled + grown, len(request.prompt) + request.max_new_tokens)


@dataclasses.dataclass(eq=False)
class Slot:
    """One occupied slot: its request and the host's view of its progress."""

    request: Request
    params: sampling.RowParams  # the request's one-row parameters
    sequence: tuple[int, ...]  # what the slot prefills: the prompt, then tokens of a preemption
    tokens: list[int]  # output tokens received so far
    logprobs: list[float]  # their log-probs
    prefilled: int = 0  # tokens of ``sequence`` in the slot's cache
    constraint_start: int = 0  # the automaton state after ``sequence`` (``constraints``)
    cached: int = 0  # of those, the leading ones it shares from the prefix cache (not prefilled)
    sample: int = 0  # which of its request's samples it draws (its key, ``sample_key``)
    leader: Slot | None = None  # the slot it waits for (paged memory): holds no page till then
    shares: int = 0  # the leader's leading cache slots it will share
    # Its Mirostat mu after the tokens received (float32; None: the request's start value), so
    # that a preempted request resumes with it
    mirostat_mu: np.float32 | None = None

    @classmethod
    def admit(cls, request: Request, params: sampling.RowParams, resumed: Slot | None = None,
              sample: int = 0) -> Slot:
        """Sample ``sample`` of ``request`` entering a slot, resuming the output of its
        ``resumed`` (preempted) slot: it prefills its prompt and those tokens."""
        tokens, logprobs = (resumed.tokens, resumed.logprobs) if resumed else ([], [])
        return cls(request, params, request.prompt + tuple(tokens), tokens, logprobs,
                   sample=sample, mirostat_mu=resumed.mirostat_mu if resumed else None)

    @property
    def key(self) -> int | str | tuple[int | str, int]:
        """The sample's key in results (``requests.sample_key``)."""
        return sample_key(self.request.id, self.sample, self.request.n)

    @property
    def waits(self) -> bool:
        """Waiting for its leader's pages (holds none, prefills nothing)."""
        return self.leader is not None

    @property
    def prefilling(self) -> bool:
        """The sequence is not yet wholly in the cache (waiting for ``prefill``)."""
        return self.prefilled < len(self.sequence)

    @property
    def written(self) -> int:
        """Prompt and output tokens in the slot's row once its prefill is done (the position of
        its next output token)."""
        return len(self.request.prompt) + len(self.tokens)

    def after_call(self, chunk: int | None, rounds: int) -> int:
        """Cache slots the slot holds after the next call (``tokens_after_call``; none while it
        waits)."""
        if self.waits:
            return 0
        if self.prefilling:
            return tokens_after_call(self.request, len(self.sequence), self.prefilled, chunk,
                                     rounds)
        return min(self.written + rounds, len(self.request.prompt) + self.request.max_new_tokens)

    def in_cache(self) -> tuple[tuple[int, ...], int]:
        """The tokens whose keys and values the slot's cache holds in its first ``filled`` slots
        (once running, the last token aside: a finished request's is never fed), and
        ``filled``."""
        if self.prefilling:
            return self.sequence, self.prefilled
        return self.request.prompt + tuple(self.tokens), self.written - 1

    def receive(self, tokens: list[int], logprobs: list[float], mirostat_mu: np.float32) -> None:
        """Append the output tokens (and log-probs) one engine call produced, and keep the
        Mirostat ``mu`` they left."""
        self.tokens += tokens
        self.logprobs += logprobs
        self.mirostat_mu = mirostat_mu

    def completion(self, slot: int, finish: int) -> Completion:
        """The output of the slot's finished request (``finish``: its finish code)."""
        return Completion(request_id=self.request.id, slot=slot, tokens=self.tokens,
                          logprobs=np.asarray(self.logprobs, np.float32),
                          finish_reason=FINISH_REASONS[finish], cached_tokens=self.cached,
                          sample=self.sample, key=self.key)
