"""Prefix sharing measured: requests served through a paged ``serving.SlotEngine`` on a wall
clock, with what the prefill computed and the pool held, and the roofline of a shared prefix.

What a caller relies on:

- ``serve`` runs requests that all arrive at once (an offline batch: inserted while they fit,
  ``steps_per_call`` decode rounds per engine call) and times each sample's first token from
  the start. ``prefill_tokens`` counts the tokens the prefills computed: each sample's prompt
  less the tokens it shared (``Completion.cached_tokens``); with no preemption (``preemptions``
  says) that is every prefill token, a deterministic count.
- ``shared_prompt_requests`` builds the shared-prefix workload: one system prompt, then a
  question of each request's own.
- ``prefill_seconds`` is the roofline of prefilling ``tokens`` tokens of a model of ``params``
  parameters: ``2 * params`` FLOPs per token against the weights read once per prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from decodelab import serving
from decodelab.checks import check_int, check_number
from decodelab.sampling import SamplingParams


def shared_prompt_requests(count: int, system: int, question: int, output: int, *,
                           vocab_size: int, seed: int, params: SamplingParams,
                           n: int = 1) -> list[serving.Request]:
    """``count`` requests of ``n`` samples: one ``system``-token prompt shared by all, then a
    ``question``-token question of each one's own (token ids drawn from ``seed``), ``output``
    tokens each (request i: seed ``seed + i``)."""
    for name, value in (("count", count), ("system", system), ("question", question),
                        ("output", output), ("n", n)):
        check_int(name, value, 1 if name != "system" and name != "question" else 0)
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab_size, system).tolist()
    return [serving.Request(id=i, prompt=head + rng.integers(0, vocab_size, question).tolist(),
                            max_new_tokens=output, params=params, seed=seed + i, n=n)
            for i in range(count)]


def serve(engine: serving.SlotEngine, requests: Sequence[serving.Request], *,
          steps_per_call: int, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Serve ``requests`` (all arriving now) on ``engine``; returns ``ttft_s`` (each sample's
    first token, seconds from the start, by completion order), ``wall_s``, ``output_tokens``,
    ``output_tokens_per_s``, ``peak_pages`` (most pool pages read at once during the serve,
    the pool's high-water mark, so pages freed within one engine call count), ``prefill_tokens``
    and ``preemptions`` (module docstring)."""
    queue, first, done = list(requests), {}, []
    preemptions = 0
    if engine.pool is not None:
        engine.pool.peak = engine.pool.used  # the high-water mark of this serve alone
    start = clock()
    while queue or engine.active:
        fit = engine.room(queue)
        if not fit and not engine.active:
            raise ValueError(f"request {queue[0].id!r} does not fit the idle engine: "
                             f"{engine.check(queue[0]) or 'its pages exceed the pool'}")
        for _ in range(fit):
            engine.insert(queue.pop(0))
        result = engine.step(steps_per_call)
        now = clock() - start
        first.update({key: now for key, tokens in result.tokens.items()
                      if tokens and key not in first})
        preemptions += len(result.preempted)
        queue[:0] = result.preempted
        done += result.finished
    wall = clock() - start
    prompts = {r.id: len(r.prompt) for r in requests}
    output = sum(len(c.tokens) for c in done)
    return {"ttft_s": [first[c.key] for c in done], "wall_s": wall, "output_tokens": output,
            "output_tokens_per_s": output / wall,
            "peak_pages": engine.pool.peak if engine.pool is not None else 0,
            "prefill_tokens": sum(prompts[c.request_id] - c.cached_tokens for c in done),
            "preemptions": preemptions}


def prefill_seconds(params: float, tokens: int, bandwidth: float, flops_per_s: float,
                    bytes_per_param: int = 2) -> float:
    """Roofline seconds to prefill ``tokens`` tokens in one pass: ``max(2 * params * tokens /
    flops_per_s, params * bytes_per_param / bandwidth)`` (attention's own FLOPs left out)."""
    check_number("params", params, 0, open_low=True)
    check_int("tokens", tokens, 0)
    for name, rate in (("bandwidth", bandwidth), ("flops_per_s", flops_per_s)):
        check_number(name, rate, 0, open_low=True)
    return max(2 * params * tokens / flops_per_s, params * bytes_per_param / bandwidth)
