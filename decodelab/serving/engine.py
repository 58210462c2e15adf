"""SlotEngine: a fixed number of slots sharing one static-shape decode state.

Conventions (every caller relies on them):

- A slot is a row of one ``decode.DecodeState`` of ``num_slots`` rows and ``max_len`` cache slots
  per row (the slot's capacity: prompt + output). ``insert`` places a request in a free slot;
  its prompt is prefilled by the next ``prefill`` (the first thing ``step`` does), which runs the
  prompts of every slot waiting then as one ``[R, T]`` block (``R`` and ``T`` rounded up to powers
  of two, so a new count or length rarely compiles) through the model, in one compiled call
  (``slot_prefill.prefill_rows``). Keys and values go straight into those slots' rows of the
  shared cache (a ``cache.RowView``: no fresh cache, no copy of a row; a quantized cache copies
  the rows it prefills), and every other per-row field of the slot (tokens, lengths, sampling
  parameters, seed key, stop sequences, budget, log-probs) is rewritten: nothing of the slot's
  previous request is read again (its stale cache slots past the new length are never attended).
- With ``prefill_chunk=C`` a prompt enters C tokens per engine call (Sarathi-style chunked
  prefill): each call runs one chunk of every waiting prompt, then the decode rounds of the
  running slots; a slot is running (decoding) once its last chunk is in.
- ``step(n)`` runs up to ``n`` rounds of ``decode.step`` (the loop body of ``generate``) over all
  slots in one compiled ``lax.while_loop`` (a ``loop.CompiledLoop``); it stops early once no slot
  is running. On paged memory it decodes only the occupied slots, taken out as a state of a
  power-of-two number of rows that shares the page pool (``advance_rows``), so a step's cost
  follows the requests running, not ``num_slots``. Rows that have finished, and free slots, are carried without advancing, so
  ``step(n)`` gives the same tokens as ``n`` calls of ``step(1)``.
- The step contains the processors the engine serves and no other (``sampling.Plan``): the
  ``sampling.union`` of the plans of the requests it admits, each processor applied to the slots
  that enable it. An engine built with ``serves`` fixes that set (and refuses a request outside
  it); by default the set grows with the requests admitted, so an engine that has served only
  greedy requests runs an argmax. A request that adds to the set compiles the engine's programs
  once more (once per new set, never more: the set only grows), the rows already decoding are
  carried over unchanged; values within the set compile nothing. Penalty counts are carried in
  the state when the set holds a penalty, as in ``generate``.
- Request ids are unique among the requests an engine holds: ``insert`` refuses an id that is
  decoding, and ``run`` refuses a list with a repeated id before anything runs.
- The token at position p of a request is drawn with ``fold_in(key(seed), p)``, so a request's
  tokens depend only on its prompt, parameters, seed and budget: never on its slot, its batch-mates
  or when it was inserted. They equal ``generate(model, [prompt], params, budget, seed=[seed],
  eos_ids=..., stop_sequences=..., max_len=engine.max_len)`` on that request alone.
- Paged memory (``kv_tokens``): the cache is a ``paged.PagedKVCache`` pool of ``kv_tokens /
  page_size`` pages of ``page_size`` slots, and a request holds only the pages its tokens fill,
  allocated page by page (the host's ``paged.PagePool``) before each call for the slots that call
  can write (its prefill chunk and its ``n`` decode rounds). Then
  ``num_slots`` bounds the running requests (the rows of the state) and the pool bounds their
  memory: ``room`` admits a request while its prompt's pages, and the next call's growth of the
  running requests, fit in the free pages. When a call's growth does not fit, the most recently
  admitted request is preempted (its pages freed, its slot emptied, ``StepResult.preempted``
  hands it back to the caller, who queues it again); when it is inserted again its prompt and the
  tokens it had generated are prefilled together (recompute, as vLLM does), and it goes on from
  there. Each token is drawn with its request's seed at its position, so a preempted request
  ends with the tokens (and log-probs) of an uninterrupted run.
- An engine call (``step``) reads the device once: one packed array with each slot's finish code,
  length and the tokens (with log-probs) of its last ``n`` positions, from which the host appends
  each request's new tokens; no other value is read back and nothing else waits for the device.
  A finished request is retired by the ``step`` that finished it: its output (gathered on the
  host call by call) is returned and its slot is free for the next ``insert``.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab import sampling
from decodelab.cache import quantized as kvquant
from decodelab.checks import (check_memory, check_model, check_size, is_int, kv_cache_bytes, nbytes,
                              position_limit)
from decodelab.decode.generation import DecodeState
from decodelab.decode.request import (FINISH_REASONS, LENGTH, RUNNING, bucket_length, check_eos,
                                      decode_buffers)
from decodelab.model.attention import BLOCK_SLOTS
from decodelab.sampling.params import SamplingParams
from decodelab.serving import paged, slot_prefill
from decodelab.serving.engine_programs import (ADVANCE, advance_rows, empty_state, harvest,
                                               plans_of, replan)
from decodelab.serving.requests import Completion, Request, StepResult


class SlotEngine:
    """``num_slots`` requests decoding together, each in its own row of one static-shape state.

    Args:
      model: a ``Transformer`` (or a module with its call signature and a ``config``).
      num_slots: rows of the shared state (the largest batch).
      max_len: cache slots per row: a request needs ``len(prompt) + max_new_tokens <= max_len``.
        Default: the model's position table (``max_seq_len``).
      eos_ids: ids that end any request (finish reason "eos"): the model's, shared by all slots.
      max_stop_sequences, max_stop_width: room for each request's own stop sequences.
      kv_cache: as in ``generate``: None (a float cache), "int8", "int4" or a ``kvquant.Kivi``.
      serves: the sampling parameters the engine serves (one ``SamplingParams`` per kind of
        request): its step contains the processors any of them enables and no other, and it
        refuses a request that enables another. Default: decide from the requests admitted,
        starting from greedy and compiling once more for each new set of processors.
      prefill_chunk: None (default) prefills each prompt whole in the engine call after its
        insert; an int C prefills at most C tokens of each waiting prompt per engine call, the
        rest in later calls, each chunk followed by that call's decode rounds of the running
        slots (chunked prefill, as in Sarathi-Serve): a long prompt then delays the running
        requests' next tokens by one chunk per call instead of by its whole prefill.
      kv_tokens: None (default) gives every slot its own ``max_len`` cache slots; an int M puts
        the keys and values of M tokens in all in a shared pool of ``M / page_size`` pages,
        which requests take page by page as they grow, with memory-bounded admission and
        preemption (module docstring). A float cache only.
      page_size: slots per page of the pool (a power of two dividing the blocked attention's
        block); ``max_len`` must be a multiple of it.

    Raises ValueError before anything is allocated when the ``num_slots x max_len`` cache and
    buffers need more than the memory limit (``checks.check_memory``).
    """

    def __init__(self, model: nnx.Module, num_slots: int, max_len: int | None = None, *,
                 eos_ids: int | Sequence[int] = (), max_stop_sequences: int = 4,
                 max_stop_width: int = 8, kv_cache: str | None = None,
                 serves: Sequence[SamplingParams] | None = None,
                 prefill_chunk: int | None = None, kv_tokens: int | None = None,
                 page_size: int = 16):
        check_model("model", model)
        self.num_slots = check_size("num_slots", num_slots, 1)
        kvquant.check_kind("kv_cache", kv_cache)
        self.kv_cache = kv_cache
        limit = position_limit(model)
        if max_len is None:
            if not limit:
                raise ValueError("max_len must be given for a model without a position table")
            max_len = limit
        self.max_len = check_size("max_len", max_len, 2)
        if limit and self.max_len > limit:
            raise ValueError(f"max_len must be <= {limit}, the model's position table "
                             f"(max_seq_len), got {self.max_len}")
        self.max_stop_sequences = check_size("max_stop_sequences", max_stop_sequences, 0)
        self.max_stop_width = check_size("max_stop_width", max_stop_width, 1)
        if prefill_chunk is not None and (not is_int(prefill_chunk) or not
                                          1 <= prefill_chunk <= self.max_len):
            raise ValueError(f"prefill_chunk must be None (whole prompts) or an int in [1, "
                             f"max_len={self.max_len}], got {prefill_chunk!r}")
        self.prefill_chunk = None if prefill_chunk is None else int(prefill_chunk)
        self._pool = None
        if kv_tokens is not None:
            if kv_cache is not None:
                raise ValueError(f"kv_cache must be None (float) with paged memory (kv_tokens="
                                 f"{kv_tokens!r}), got {kv_cache!r}")
            if not is_int(kv_tokens) or kv_tokens < 1:
                raise ValueError(f"kv_tokens must be None (a max_len cache per slot) or an int "
                                 f">= 1 (tokens of KV memory in the pool), got {kv_tokens!r}")
            page_size = paged.check_page_size(page_size, BLOCK_SLOTS)
            if kv_tokens % page_size:
                raise ValueError(f"page_size must divide kv_tokens={kv_tokens} (the pool is whole "
                                 f"pages), got {page_size}")
            if self.max_len % page_size:
                raise ValueError(f"max_len must be a multiple of page_size={page_size} with "
                                 f"paged memory, got {self.max_len}")
            self._pool = paged.PagePool(int(kv_tokens) // page_size, page_size)
            self._table = np.full((self.num_slots, self.max_len // page_size),
                                  self._pool.num_pages, np.int32)
        self.vocab_size = model.config.vocab_size
        self._eos_mask = check_eos(eos_ids, self.vocab_size)
        self._fixed_plan = serves is not None
        self._plan = sampling.union(plans_of("serves", serves, self.vocab_size))
        # The shared state holds max_len output columns per slot; a prefill is up to every slot.
        buffers = decode_buffers(model.config, self.num_slots, self.max_len, self.max_len, 0)
        if self._pool is not None:  # the pool instead of num_slots x max_len slots
            buffers["KV cache"] = kv_cache_bytes(model.config, 1, self._pool.num_pages *
                                                 self._pool.page_size)
        buffers["prefill logits"] = nbytes(
            (self.num_slots, self.prefill_chunk or self.max_len, self.vocab_size), np.float32)
        check_memory("SlotEngine", buffers, {"num_slots": self.num_slots,
                                             "max_len": self.max_len})
        self._graphdef, self._weights = nnx.split(model)
        self._state = empty_state(model.config, self.num_slots, self.max_len,
                                   self.max_stop_sequences, self.max_stop_width, self._eos_mask,
                                   self._plan, kv_cache, None if self._pool is None else
                                   (self._pool.num_pages, self._pool.page_size))
        self._slots: list[Request | None] = [None] * self.num_slots
        # Host-side view of each slot: prompt tokens in its cache, output tokens and log-probs
        # received so far (the device state is read once per engine call, in ``step``).
        self._prefilled = [0] * self.num_slots
        self._row_params: list[sampling.RowParams | None] = [None] * self.num_slots
        self._tokens: list[list[int]] = [[] for _ in range(self.num_slots)]
        self._logprobs: list[list[float]] = [[] for _ in range(self.num_slots)]
        # What a slot prefills: its request's prompt, then the tokens it had generated before a
        # preemption; preempted requests' outputs so far, by id, until they are inserted again.
        self._sequence: list[tuple[int, ...]] = [() for _ in range(self.num_slots)]
        self._resume: dict[int | str, tuple[Request, list[int], list[float]]] = {}
        self._preempted: list[Request] = []  # since the last StepResult
        self._admitted: list[int] = []  # occupied slots, oldest admission first
        self._lookahead = 1  # decode rounds of the last call: what ``room`` reserves for the next
        self._table_dirty = False

    @property
    def plan(self) -> sampling.Plan:
        """The processors the engine's step contains (grows with the requests admitted unless
        the engine was built with ``serves``)."""
        return self._plan

    # --- Slots ------------------------------------------------------------------------------

    @property
    def free_slots(self) -> list[int]:
        return [i for i, r in enumerate(self._slots) if r is None]

    @property
    def active(self) -> dict[int, Request]:
        """Slot -> the request decoding in it."""
        return {i: r for i, r in enumerate(self._slots) if r is not None}

    @property
    def prefilling(self) -> list[int]:
        """Slots whose request's prompt is not yet wholly in the cache (waiting for ``prefill``)."""
        return [i for i, r in enumerate(self._slots)
                if r is not None and self._prefilled[i] < len(self._sequence[i])]

    @property
    def pool(self) -> paged.PagePool | None:
        """The page pool's host-side accounting (paged memory), else None."""
        return self._pool

    @property
    def state(self) -> DecodeState:
        """The shared decode state (for inspection; the engine owns and donates it)."""
        return self._state

    def check(self, request: Request) -> str | None:
        """Why this engine can never serve ``request``, or None if it can."""
        bad = [t for t in request.prompt if not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt holds token id {bad[0]}; ids must be in [0, {self.vocab_size})"
        need = len(request.prompt) + request.max_new_tokens
        if need > self.max_len:
            return (f"prompt ({len(request.prompt)} tokens) + max_new_tokens "
                    f"({request.max_new_tokens}) = {need} exceeds the slot capacity "
                    f"max_len={self.max_len}")
        if self._pool is not None and paged.pages_for(need, self._pool.page_size) > (
                self._pool.num_pages):
            return (f"prompt + max_new_tokens = {need} tokens need "
                    f"{paged.pages_for(need, self._pool.page_size)} pages of "
                    f"{self._pool.page_size}, more than the whole pool (kv_tokens="
                    f"{self._pool.num_pages * self._pool.page_size})")
        if len(request.stop_sequences) > self.max_stop_sequences:
            return (f"{len(request.stop_sequences)} stop sequences, the engine has room for "
                    f"max_stop_sequences={self.max_stop_sequences}")
        for s in request.stop_sequences:
            bad = [t for t in s if not 0 <= t < self.vocab_size]
            if len(s) > self.max_stop_width or bad:
                return (f"stop sequence {list(s)} must have <= max_stop_width="
                        f"{self.max_stop_width} ids in [0, {self.vocab_size})")
        try:
            plan = request.params.per_row(1, self.vocab_size).plan
        except ValueError as error:
            return f"params: {error}"
        if self._fixed_plan and not self._plan.covers(plan):
            extra = [name for name in plan.active if name not in (self._plan.active or ())]
            what = f"enable {extra}" if extra else "are sampled"
            return (f"params {what}, which the engine does not serve (its plan is fixed by "
                    f"serves: {self._plan})")
        return None

    def room(self, waiting: Sequence[Request]) -> int:
        """How many requests from the head of ``waiting`` can be inserted now: as many as there
        are free slots and, with paged memory, as long as each one's first prefill chunk and
        decode rounds fit in the pages left once the running requests' next call is provided
        for (first come, first served: the count stops at the first that does not fit)."""
        count = min(len(waiting), len(self.free_slots))
        if self._pool is None:
            return count
        free = self._pool.free - sum(self._pool.lacks(slot, self._growth(slot))
                                     for slot in self._admitted)
        for i, request in enumerate(itertools.islice(waiting, count)):
            resumed = self._resume.get(request.id)
            sequence = len(request.prompt) + (len(resumed[1]) if resumed and resumed[0] is
                                              request else 0)
            free -= paged.pages_for(self._grown(request, sequence, 0), self._pool.page_size)
            if free < 0:
                return i
        return count

    def _grown(self, request: Request, sequence: int, prefilled: int) -> int:
        """Cache slots a request holds after the next call: its next prefill chunk and, once
        that completes its prefill, the call's decode rounds (at most its whole length)."""
        chunk = min(sequence - prefilled, self.prefill_chunk or sequence)
        filled = prefilled + chunk
        rounds = self._lookahead if filled >= sequence else 0
        return min(filled + rounds, len(request.prompt) + request.max_new_tokens)

    def _growth(self, slot: int) -> int:
        request = self._slots[slot]
        if self._prefilled[slot] < len(self._sequence[slot]):
            return self._grown(request, len(self._sequence[slot]), self._prefilled[slot])
        held = len(request.prompt) + len(self._tokens[slot])
        return min(held + self._lookahead, len(request.prompt) + request.max_new_tokens)

    def _provide_pages(self) -> None:
        """Give every occupied slot the pages its next call writes, preempting the most recently
        admitted requests while they do not fit; uploads the block table if it changed.
        The preempted requests (oldest admission first) go to the next ``StepResult``."""
        pool, preempted = self._pool, []
        while sum(pool.lacks(slot, self._growth(slot)) for slot in self._admitted) > pool.free:
            slot = self._admitted[-1]  # the newest: vLLM's recompute preemption order
            request = self._slots[slot]
            self._resume[request.id] = (request, self._tokens[slot], self._logprobs[slot])
            preempted.insert(0, request)
            self._free_slot(slot)
            # Not running on the device either: the decode loop must not advance the row.
            self._state = self._state.replace(finish=self._state.finish.at[slot].set(LENGTH))
        for slot in self._admitted:
            if pool.grow(slot, self._growth(slot)):
                self._table[slot] = pool.table_row(slot, self._table.shape[1])
                self._table_dirty = True
        self._upload_table()
        self._preempted += preempted

    def _upload_table(self) -> None:
        """Put the host's block table in the device state if it changed (a small transfer to
        the device; nothing waits for it)."""
        if self._table_dirty:
            cache = self._state.cache.replace(table=jnp.asarray(self._table))
            self._state = self._state.replace(cache=cache)
            self._table_dirty = False

    def _free_slot(self, slot: int) -> None:
        """Empty ``slot`` (its request retired or preempted) and return its pages."""
        self._slots[slot] = None
        self._admitted.remove(slot)
        if self._pool is not None and self._pool.release(slot):
            self._table[slot] = self._pool.num_pages
            self._table_dirty = True

    def insert(self, request: Request, slot: int | None = None) -> int:
        """Place ``request`` in ``slot`` (default: the lowest free one); returns the slot. Its
        prompt is prefilled by the next ``prefill`` (which ``step`` runs first), together with
        every other prompt waiting then."""
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {request!r}")
        reason = self.check(request)
        if reason:
            raise ValueError(f"request {request.id!r} cannot be served: {reason}")
        decoding = [s for s, r in self.active.items() if r.id == request.id]
        if decoding:
            raise ValueError(f"request id {request.id!r} is already decoding in slot "
                             f"{decoding[0]}; ids must be unique among the requests an engine "
                             f"holds")
        free = self.free_slots
        if slot is None:
            if not free:
                raise ValueError(f"no free slot for request {request.id!r}: all "
                                 f"{self.num_slots} slots are decoding")
            slot = free[0]
        elif not is_int(slot) or slot not in free:
            raise ValueError(f"slot must be a free slot, one of {free}, got {slot!r}")
        params = request.params.per_row(1, self.vocab_size)
        if not self._plan.covers(params.plan):  # a new set of processors: compiles once more
            self._plan = sampling.union([self._plan, params.plan])
            self._state = replan(self._state, plan=self._plan)
        slot = int(slot)
        self._slots[slot], self._row_params[slot] = request, params
        tokens, logprobs = [], []
        if request.id in self._resume and self._resume[request.id][0] is request:
            _, tokens, logprobs = self._resume.pop(request.id)
        self._prefilled[slot], self._tokens[slot], self._logprobs[slot] = 0, tokens, logprobs
        self._sequence[slot] = request.prompt + tuple(tokens)
        self._admitted.append(slot)
        return slot

    def prefill(self) -> int:
        """One compiled call that writes the next chunk of every waiting prompt (the whole prompt
        without ``prefill_chunk``) into its slot's rows of the shared state; returns how many
        prompts still wait. Nothing is read back: the call is only dispatched. With paged
        memory it first provides the pages (``step``'s), which may preempt requests."""
        if self._pool is not None:
            self._provide_pages()
        slots = self.prefilling
        if not slots:
            return 0
        R = bucket_length(len(slots), minimum=1)
        sequences = [self._sequence[i] for i in slots]
        remaining = [len(q) - self._prefilled[i] for q, i in zip(sequences, slots)]
        counts = [min(n, self.prefill_chunk or n) for n in remaining]
        T = min(bucket_length(max(counts)), self.prefill_chunk or self.max_len, self.max_len)
        offsets = [self._prefilled[i] for i in slots]
        # A chunk from slot 0 attends to itself only; a later one to the slot's whole row.
        reach = T if not any(offsets) else self.max_len
        block = np.zeros((R, T), np.int32)
        stops = np.full((R, self.max_stop_sequences, self.max_stop_width), -1, np.int32)
        pad = R - len(slots)
        requests = [self._slots[i] for i in slots] + [self._slots[slots[0]]] * pad
        for r, (sequence, offset, count) in enumerate(zip(sequences, offsets, counts)):
            block[r, :count] = sequence[offset:offset + count]
        for r, request in enumerate(requests):
            for m, s in enumerate(request.stop_sequences):
                stops[r, m, self.max_stop_width - len(s):] = s
        chunk = slot_prefill.PrefillChunk(
            block=block,
            rows=np.asarray(slots + list(range(self.num_slots, self.num_slots + pad)), np.int32),
            offsets=np.asarray(offsets + [0] * pad, np.int32),
            counts=np.asarray(counts + [0] * pad, np.int32),
            prompt_lengths=np.asarray([len(r.prompt) for r in requests], np.int32),
            ends=np.asarray([len(q) for q in sequences] + [1] * pad, np.int32),
            keys=sampling.seed_keys(np.asarray([r.seed for r in requests], np.uint32)),
            params=tuple(self._row_params[i].with_plan(self._plan)
                         for i in slots + [slots[0]] * pad), stop_ids=stops,
            budgets=np.asarray([r.max_new_tokens for r in requests], np.int32))
        self._state = slot_prefill.prefill_rows(self._weights, self._state, chunk,
                                                graphdef=self._graphdef, reach=reach)
        for i, count in zip(slots, counts):
            self._prefilled[i] += count
        return len(self.prefilling)

    def step(self, n: int = 1) -> StepResult:
        """One engine call: ``prefill`` the waiting prompts (a chunk each), advance every running
        slot by up to ``n`` tokens (one compiled loop), read the new tokens back in one transfer,
        then retire the requests that finished."""
        n = check_size("n", n, 1)
        if not any(r is not None for r in self._slots):
            return StepResult({}, {}, [], 0, self._take_preempted())
        self._lookahead = n
        self.prefill()
        rows = self._decode_rows()
        if rows is None:
            rounds, self._state = ADVANCE.run((self._weights, jnp.asarray(n, jnp.int32)),
                                               (jnp.zeros((), jnp.int32), self._state),
                                               graphdef=self._graphdef)
        else:
            rounds, self._state = advance_rows(self._weights, self._state, rows,
                                                jnp.asarray(n, jnp.int32),
                                                graphdef=self._graphdef)
        starts = np.asarray([len(r.prompt) + len(self._tokens[i]) if r is not None else 0
                             for i, r in enumerate(self._slots)], np.int32)
        width = bucket_length(n, minimum=8)  # a few window widths: n itself is traced
        packed = jax.device_get(harvest(self._state, starts, rounds, n=width))  # one transfer
        finish, lengths, rounds = packed[:, 0], packed[:, 1], int(packed[0, 2])
        new_tokens, generated, completions = {}, {}, []
        prefilling = set(self.prefilling)
        for slot, request in self.active.items():
            if slot in prefilling:  # still prefilling: not running
                new_tokens[request.id], generated[request.id] = [], len(self._tokens[slot])
                continue
            new = int(lengths[slot]) - int(starts[slot])
            self._tokens[slot] += packed[slot, 3:3 + new].tolist()
            self._logprobs[slot] += packed[slot, 3 + width:3 + width + new].view(
                np.float32).tolist()
            new_tokens[request.id] = packed[slot, 3:3 + new].tolist()
            generated[request.id] = len(self._tokens[slot])
            if finish[slot] != RUNNING:
                completions.append(Completion(
                    request_id=request.id, slot=slot, tokens=self._tokens[slot],
                    logprobs=np.asarray(self._logprobs[slot], np.float32),
                    finish_reason=FINISH_REASONS[int(finish[slot])]))
                self._free_slot(slot)
        if self._pool is not None:  # retired slots' rows hold no page from now on
            self._upload_table()
        return StepResult(generated, new_tokens, completions, rounds, self._take_preempted())

    def _decode_rows(self) -> np.ndarray | None:
        """On paged memory, the slots a call decodes: the occupied ones, padded with free slots
        to a power of two (``R``: a few compiled sizes); None to decode every slot (a padded
        cache, whose rows would be copied, or ``R`` = ``num_slots``)."""
        if self._pool is None:
            return None
        occupied = sorted(self._admitted)
        R = bucket_length(max(len(occupied), 1), minimum=1)
        if R >= self.num_slots:
            return None
        free = [i for i in range(self.num_slots) if self._slots[i] is None]
        return np.asarray(sorted(occupied + free[:R - len(occupied)]), np.int32)

    def _take_preempted(self) -> list[Request]:
        preempted, self._preempted = self._preempted, []
        return preempted

    def run(self, requests: Sequence[Request], n: int = 8) -> dict[int | str, Completion]:
        """Serve ``requests`` in order, filling free slots before every step (no clock): a
        convenience for tests and offline use. Requests that cannot be served, and a repeated id
        (among ``requests`` or with a request already decoding), raise before anything runs."""
        queue, done = list(requests), {}
        for r in queue:
            if not isinstance(r, Request):
                raise ValueError(f"requests must hold Request objects, got {r!r}")
            reason = self.check(r)
            if reason:
                raise ValueError(f"request {r.id!r} cannot be served: {reason}")
        ids = collections.Counter([r.id for r in queue] + [r.id for r in self.active.values()])
        repeated = sorted((i for i, count in ids.items() if count > 1), key=str)
        if repeated:
            raise ValueError(f"request ids must be unique, got {repeated} more than once "
                             f"(among requests and the requests decoding); a repeated id would "
                             f"lose a completion")
        while queue or self.active:
            for _ in range(self.room(queue)):
                self.insert(queue.pop(0))
            result = self.step(n)
            queue[:0] = result.preempted  # first in line again
            for c in result.finished:
                done[c.request_id] = c
        return done
