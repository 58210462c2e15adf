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
- With ``EngineOptions(prefill_chunk=C)`` a prompt enters C tokens per engine call (Sarathi-style
  chunked prefill): each call runs one chunk of every waiting prompt, then the decode rounds of
  the running slots; a slot is running (decoding) once its last chunk is in.
- ``step(n)`` runs up to ``n`` rounds of ``decode.step`` (the loop body of ``generate``) over all
  slots in one compiled ``lax.while_loop`` (a ``loop.CompiledLoop``); it stops early once no slot
  is running. On paged memory it decodes only the occupied slots, taken out as a state of a
  power-of-two number of rows that shares the page pool (``advance_rows``), so a step's cost
  follows the requests running, not ``num_slots``. Rows that have finished, and free slots, are
  carried without advancing, so ``step(n)`` gives the same tokens as ``n`` calls of ``step(1)``.
- The step is one program for every mix of requests (``sampling``'s one-program rule): every
  processor is in it, skipped at run time when no running slot enables it, and the argmax path
  is taken when every running slot is greedy; admitting a request with other processors
  compiles nothing. What the history processors read is carried, as in ``generate``.
- Constraints (``SamplingParams.regex`` / ``json_schema``) are per request: each slot carries
  its automaton state, the held patterns' table rides in the state (``constraints``).
- Request ids are unique among the requests an engine holds: ``insert`` refuses an id that is
  decoding, and ``run`` refuses a list with a repeated id before anything runs. A request's
  ``n`` samples take a slot each (``samples``), keyed by ``requests.sample_key``.
- The token at position p of a request is drawn with ``fold_in(key(seed), p)``, so a request's
  tokens depend only on its prompt, parameters, seed and budget: never on its slot, its batch-mates
  or when it was inserted. They equal ``generate(model, [prompt], params, budget, seed=[seed],
  max_len=engine.max_len, options=DecodeOptions(eos_ids=..., stop_sequences=..., tokenizer=...))``
  on that request alone.
- Paged memory (``kv_tokens``): the cache is a ``paged.PagedKVCache`` pool of ``kv_tokens /
  page_size`` pages of ``page_size`` slots, and a request holds only the pages its tokens fill,
  allocated page by page before each call for the slots that call can write (its prefill chunk
  and its ``n`` decode rounds). The paging policy is the host's ``pool.PagedMemory``: the engine
  tells it what each slot will hold and asks it what fits and whom to preempt. Then
  ``num_slots`` bounds the running requests (the rows of the state) and the pool bounds their
  memory: ``room`` admits a request while its prompt's pages, and the next call's growth of the
  running requests, fit in the free pages. When a call's growth does not fit, the most recently
  admitted request is preempted (its pages freed, its slot emptied, ``StepResult.preempted``
  hands it back to the caller, who queues it again); when it is inserted again its prompt and the
  tokens it had generated are prefilled together (recompute, as vLLM does), and it goes on from
  there. Each token is drawn with its request's seed at its position, so a preempted request
  ends with the tokens (and log-probs) of an uninterrupted run. With ``prefix_cache=True`` the
  full pages of every request's tokens stay recorded by their prefix (``prefix``), and an
  inserted request shares those of its prompt (a preempted one's: of its prompt and tokens; a
  page it reads in part copied on write) and prefills only the rest, or waits for a request
  prefilling the same prefix in the same call (``samples``): the same tokens as without it.
- An engine call (``step``) reads the device once: one packed array with each slot's finish code,
  length and the tokens (with log-probs) of its last ``n`` positions, from which the host appends
  each request's new tokens; no other value is read back and nothing else waits for the device.
  A finished request is retired by the ``step`` that finished it: its output (gathered on the
  host call by call) is returned and its slot is free for the next ``insert``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.cache import check_kind, round_up
from decodelab.checks import (check_bool, check_memory, check_model, check_size, is_int,
                              kv_cache_bytes, nbytes, position_limit, tokenizer_size)
from decodelab.decode.generation import DecodeState
from decodelab.decode.request import LENGTH, bucket_length, check_eos, decode_buffers, token_ids
from decodelab.model.parts import split
from decodelab.serving import samples, slot_prefill
from decodelab.serving.constraints import SlotConstraints
from decodelab.serving.engine_programs import (ADVANCE, advance_rows, collect, copy_pages,
                                               empty_state, harvest)
from decodelab.serving.options import EngineOptions
from decodelab.serving.pages import PagePool
from decodelab.serving.pool import PagedMemory
from decodelab.serving.requests import (Completion, Request, StepResult, check_unique_ids,
                                        stops_refused)
from decodelab.serving.slots import Slot, tokens_after_call
from decodelab.sharding import data_size


class SlotEngine:
    """``num_slots`` requests decoding together, each in its own row of one static-shape state.

    Args:
      model: a ``Transformer`` (or a module with its call signature and a ``config``).
      num_slots: requests decoding together (the largest batch). On a mesh the shared state
        has a multiple of the ``data`` axis rows: the rows past ``num_slots`` are never used.
      max_len: cache slots per row: a request needs ``len(prompt) + max_new_tokens <= max_len``.
        Default: the model's position table (``max_seq_len``).
      kv_cache: as in ``generate``: None (a float cache), "int8", "int4" or a ``cache.Kivi``.
      kv_tokens: None (default) gives every slot its own ``max_len`` cache slots; an int M puts
        the keys and values of M tokens in all in a shared pool of ``M / page_size`` pages,
        which requests take page by page as they grow, with memory-bounded admission and
        preemption (module docstring). A float cache only.
      page_size: slots per page of the pool (a power of two dividing the blocked attention's
        block); ``max_len`` must be a multiple of it.
      prefix_cache: keep the full pages of requests' tokens, shared by every request whose
        prompt starts with them, and evicted least recently used when the pool needs room
        (paged memory only; ``prefix`` module docstring).
      options: the rarer arguments, an ``EngineOptions``:
        eos_ids: ids that end any request (finish reason "eos"): the model's, shared by all slots.
        max_stop_sequences, max_stop_width: room for each request's own stop sequences.
        prefill_chunk: None (default) prefills each prompt whole in the engine call after its
          insert; an int C (at most ``max_len``) prefills at most C tokens of each waiting prompt
          per engine call, the rest in later calls, each chunk followed by that call's decode
          rounds of the running slots (chunked prefill, as in Sarathi-Serve): a long prompt then
          delays the running requests' next tokens by one chunk per call instead of by its whole
          prefill.
        tokenizer: the model's tokenizer, if known: ids past its size (a padded vocabulary's
          padding) are never sampled, as in ``generate``; one with more ids than the model is
          refused.

    Raises ValueError before anything is allocated when the ``num_slots x max_len`` cache and
    buffers need more than the memory limit (``checks.check_memory``).
    """

    def __init__(self, model: nnx.Module, num_slots: int, max_len: int | None = None, *,
                 kv_cache: str | None = None, kv_tokens: int | None = None, page_size: int = 16,
                 options: EngineOptions = EngineOptions(), prefix_cache: bool = False):
        check_model("model", model)
        self.num_slots = check_size("num_slots", num_slots, 1)
        check_kind("kv_cache", kv_cache)
        self.kv_cache = kv_cache
        if not isinstance(options, EngineOptions):
            raise ValueError(f"options must be an EngineOptions, got {options!r}")
        self.options = options
        limit = position_limit(model)
        if max_len is None:
            if not limit:
                raise ValueError("max_len must be given for a model without a position table")
            max_len = limit
        self.max_len = check_size("max_len", max_len, 2)
        if limit and self.max_len > limit:
            raise ValueError(f"max_len must be <= {limit}, the model's position table "
                             f"(max_seq_len), got {self.max_len}")
        if options.prefill_chunk is not None and options.prefill_chunk > self.max_len:
            raise ValueError(f"prefill_chunk must be None (whole prompts) or an int in [1, "
                             f"max_len={self.max_len}], got {options.prefill_chunk!r}")
        self._memory = None
        if check_bool("prefix_cache", prefix_cache) and kv_tokens is None:
            raise ValueError("prefix_cache=True needs paged memory: kv_tokens must be an int")
        # The state's rows: the slots, padded to a multiple of the mesh's data axis.
        self._data = data_size(model)
        self._rows = round_up(self.num_slots, self._data)
        if kv_tokens is not None:
            if kv_cache is not None:
                raise ValueError(f"kv_cache must be None (float) with paged memory (kv_tokens="
                                 f"{kv_tokens!r}), got {kv_cache!r}")
            self._memory = PagedMemory(kv_tokens, page_size, self._rows, self.max_len,
                                       row_multiple=self._data, prefix_cache=prefix_cache)
        self.vocab_size = model.config.vocab_size
        self.tokenizer_size = tokenizer_size("options.tokenizer", options.tokenizer, self.vocab_size)
        eos_mask = check_eos(options.eos_ids, self.vocab_size)
        # The shared state holds max_len output columns per slot; a prefill is up to every slot.
        buffers = decode_buffers(model.config, self._rows, self.max_len, self.max_len, 0)
        if self._memory is not None:  # the pool instead of num_slots x max_len slots
            buffers["KV cache"] = kv_cache_bytes(model.config, 1, self._memory.tokens)
        buffers["prefill logits"] = nbytes(
            (self._rows, options.prefill_chunk or self.max_len, self.vocab_size), np.float32)
        check_memory("SlotEngine", buffers, {"num_slots": self.num_slots, "max_len": self.max_len})
        self._graphdef, self._weights = split(model)
        self._state = empty_state(model.config, self._rows, self.max_len, options, eos_mask,
                                  kv_cache, None if self._memory is None else
                                  (self._memory.num_pages, self._memory.page_size))
        self._slots: list[Slot | None] = [None] * self.num_slots
        self._constraints = SlotConstraints(self._rows, self.vocab_size, options)
        # Preempted samples' slots (their output so far), by key, until inserted again.
        self._resume: dict[int | str, Slot] = {}
        self._preempted: list[Request] = []  # since the last StepResult
        self._lookahead = 1  # decode rounds of the last call: what ``room`` reserves for the next

    # --- Slots ------------------------------------------------------------------------------

    @property
    def free_slots(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s is None]

    @property
    def active(self) -> dict[int, Request]:
        """Slot -> the request decoding in it."""
        return {i: s.request for i, s in enumerate(self._slots) if s is not None}

    @property
    def prefilling(self) -> list[int]:
        """Slots whose request's prompt is not yet wholly in the cache (waiting for ``prefill``)."""
        return [i for i, s in enumerate(self._slots) if s is not None and s.prefilling]

    @property
    def pool(self) -> PagePool | None:
        """The page pool's host-side accounting (paged memory), else None."""
        return None if self._memory is None else self._memory.pool

    @property
    def state(self) -> DecodeState:
        """The shared decode state (for inspection; the engine owns and donates it)."""
        return self._state

    def check(self, request: Request) -> str | None:
        """Why this engine can never serve ``request``, or None if it can."""
        try:
            token_ids("prompt", request.prompt, self.vocab_size)
        except ValueError as error:
            return str(error)
        need = len(request.prompt) + request.max_new_tokens
        if need > self.max_len:
            return (f"prompt ({len(request.prompt)} tokens) + max_new_tokens "
                    f"({request.max_new_tokens}) = {need} exceeds the slot capacity "
                    f"max_len={self.max_len}")
        if self._memory is not None and (reason := self._memory.refuses(need)):
            return f"prompt + max_new_tokens = {reason}"
        if reason := (samples.refused(request, self.num_slots, self._memory)
                      or stops_refused(request, self.options, self.vocab_size)
                      or self._constraints.check(request)):
            return reason
        try:
            request.params.per_row(1, self.vocab_size, self.tokenizer_size, self.options.tokenizer)
        except ValueError as error:
            return f"params: {error}"
        return None

    def room(self, waiting: Sequence[Request]) -> int:
        """How many requests from the head of ``waiting`` can be inserted now: while their
        samples have free slots and, with paged memory, each one's first prefill chunk and
        decode rounds fit in the pages left once the running requests' next call is provided
        for (first come, first served; a waiting sample holds no page, ``samples``)."""
        admits = [samples.admitted(self._resume, r) for r in waiting]
        count = samples.fitting(map(len, admits), len(self.free_slots))
        if self._memory is None:
            return count
        first, shared = [], []
        for request, admit in zip(itertools.islice(waiting, count), admits):
            resumed = samples.resumed(self._resume, request, admit[0])
            sequence = request.prompt + (tuple(resumed.tokens) if resumed else ())
            shared.append(hit := self._memory.cached(sequence))
            first.append(tokens_after_call(request, len(sequence), hit[1],
                                           self.options.prefill_chunk, self._lookahead))
        return self._memory.room(self._demand(), first, shared)

    def _demand(self) -> dict[int, int]:
        """Cache slots each occupied slot holds after the next call (paged memory's demand)."""
        return {i: s.after_call(self.options.prefill_chunk, self._lookahead)
                for i, s in enumerate(self._slots) if s is not None}

    def _provide_pages(self) -> None:
        """Give every occupied slot the pages its next call writes; the requests the pool
        preempts for it (the most recently admitted) go to the next ``StepResult``."""
        for slot, held in samples.preempt(self._slots, self._memory,
                                          self._memory.provide(self._demand())):
            self._resume[held.key] = held
            if held.request not in self._preempted:
                self._preempted.append(held.request)
            # Not running on the device either: the decode loop must not advance the row.
            self._state = self._state.replace(finish=self._state.finish.at[slot].set(LENGTH))
        self._upload_table()

    def _upload_table(self) -> None:
        """Copy the pages slots copy before writing (``pool``), and put the host's block table
        in the device state if it changed (small transfers to the device; nothing waits)."""
        copies = self._memory.take_copies()
        if copies is not None:
            self._state = copy_pages(self._state, *copies)
        table = self._memory.changed_table()
        if table is not None:
            cache = self._state.cache.replace(table=jnp.asarray(table))
            self._state = self._state.replace(cache=cache)

    def _free_slot(self, slot: int) -> None:
        """Empty ``slot`` (its request retired) and return its pages."""
        self._slots[slot] = None
        self._constraints.release(slot)
        if self._memory is not None:
            self._memory.release(slot)

    def insert(self, request: Request, slot: int | None = None) -> int:
        """Place ``request`` in ``slot`` (default: the lowest free one), each further sample
        (``Request.n``) in the lowest free slots; returns the first sample's slot. Its prompt is
        prefilled by the next ``prefill`` (which ``step`` runs first), together with every other
        prompt waiting then (paged memory: the further samples' after it, ``samples``)."""
        if not isinstance(request, Request):
            raise ValueError(f"request must be a Request, got {request!r}")
        if reason := self.check(request):
            raise ValueError(f"request {request.id!r} cannot be served: {reason}")
        decoding = [s for s, r in self.active.items() if r.id == request.id]
        if decoding:
            raise ValueError(f"request id {request.id!r} is already decoding in slot "
                             f"{decoding[0]}; ids must be unique among the requests an engine "
                             f"holds")
        free, admitted = self.free_slots, samples.admitted(self._resume, request)
        if len(free) < len(admitted):
            raise ValueError(f"no free slot for request {request.id!r}: {len(admitted)} samples "
                             f"need {len(admitted)}, {len(free)} of {self.num_slots} are free")
        if slot is None:
            slot = free[0]
        elif not is_int(slot) or slot not in free:
            raise ValueError(f"slot must be a free slot, one of {free}, got {slot!r}")
        params = request.params.per_row(1, self.vocab_size, self.tokenizer_size,
                                        self.options.tokenizer)
        places = [int(slot)] + [s for s in free if s != slot][:len(admitted) - 1]
        first = None  # the request's first sample, whom the others wait for (paged memory)
        for place, sample in zip(places, admitted):
            resumed = samples.resumed(self._resume, request, sample)
            if resumed:
                del self._resume[resumed.key]
            held = self._slots[place] = Slot.admit(request, params, resumed, sample)
            self._state, held.constraint_start = self._constraints.admit(
                self._state, place, request, held.tokens)
            if self._memory is not None:
                self._memory.admit(place)
                samples.seat(self._slots, place, self._memory, first)
            first = held if first is None else first
        if self._memory is not None:  # a leader's cache may already hold what it shares
            samples.join(self._slots, self._memory)
        return places[0]

    def prefill(self) -> int:
        """One compiled call that writes the next chunk of every waiting prompt (the whole prompt
        without ``prefill_chunk``) into its slot's rows of the shared state; returns how many
        prompts still wait. Nothing is read back: the call is only dispatched. With paged
        memory it first provides the pages (``step``'s), which may preempt requests."""
        if self._memory is not None:
            self._provide_pages()
        waiting = [(i, self._slots[i]) for i in self.prefilling if not self._slots[i].waits]
        if not waiting:
            return 0
        chunk, reach = slot_prefill.next_chunk(
            waiting, num_slots=self._rows, max_len=self.max_len,
            prefill_chunk=self.options.prefill_chunk,
            stop_shape=(self.options.max_stop_sequences, self.options.max_stop_width),
            row_multiple=self._data)
        self._state = slot_prefill.prefill_rows(self._weights, self._state, chunk,
                                                graphdef=self._graphdef, reach=reach)
        for (_, held), count in zip(waiting, chunk.counts):
            held.prefilled += int(count)
        return len(self.prefilling)

    def step(self, n: int = 1) -> StepResult:
        """One engine call: ``prefill`` the waiting prompts (a chunk each), advance every running
        slot by up to ``n`` tokens (one compiled loop), read the new tokens back in one transfer,
        then retire the requests that finished."""
        n = check_size("n", n, 1)
        if not any(s is not None for s in self._slots):
            return StepResult({}, {}, [], 0, self._take_preempted())
        self._lookahead = n
        self.prefill()
        rows = None if self._memory is None else self._memory.decode_rows()
        if rows is None:
            rounds, self._state = ADVANCE.run((self._weights, jnp.asarray(n, jnp.int32)),
                                               (jnp.zeros((), jnp.int32), self._state),
                                               graphdef=self._graphdef)
        else:
            rounds, self._state = advance_rows(self._weights, self._state, rows,
                                                jnp.asarray(n, jnp.int32),
                                                graphdef=self._graphdef)
        starts = np.zeros((self._rows,), np.int32)
        starts[:self.num_slots] = [s.written if s is not None else 0 for s in self._slots]
        width = bucket_length(n, minimum=8)  # a few window widths: n itself is traced
        packed = jax.device_get(harvest(self._state, starts, rounds, n=width))  # one transfer
        generated, new_tokens, finished = collect(packed, self._slots, starts, width)
        if self._memory is not None:  # record full pages; waiting slots join their leaders
            samples.settle(self._slots, self._memory)
        for slot in finished:
            self._free_slot(slot)
        if self._memory is not None:  # retired slots' rows hold no page from now on
            self._upload_table()
        return StepResult(generated, new_tokens, list(finished.values()), int(packed[0, 2]),
                          self._take_preempted())

    def _take_preempted(self) -> list[Request]:
        preempted, self._preempted = self._preempted, []
        return preempted

    def run(self, requests: Sequence[Request], n: int = 8) -> dict[int | str, Completion]:
        """Serve ``requests`` in order, filling free slots before every step (no clock): a
        convenience for tests and offline use; the completions by ``Completion.key`` (a sample's
        key, ``requests.sample_key``). Requests that cannot be served, and a repeated id (among
        ``requests`` or with a request already decoding), raise before anything runs."""
        queue, done = list(requests), {}
        for r in queue:
            if not isinstance(r, Request):
                raise ValueError(f"requests must hold Request objects, got {r!r}")
            if reason := self.check(r):
                raise ValueError(f"request {r.id!r} cannot be served: {reason}")
        check_unique_ids(queue, self.active.values())
        while queue or self.active:
            for _ in range(self.room(queue)):
                self.insert(queue.pop(0))
            result = self.step(n)
            queue[:0] = result.preempted  # first in line again
            done |= {c.key: c for c in result.finished}
        return done
