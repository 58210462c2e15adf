"""n samples of a request in a ``SlotEngine`` (``Request.n``): each sample takes a slot.

Conventions (every caller relies on them):

- Sample i of a request draws with ``sampling.indexed_sample_keys``' key i, so its tokens equal
  sample i of ``generate(model, [prompt], params, budget, seed=[seed], n=n)`` (sample 0 is the
  ``n=1`` output); its results are keyed by ``requests.sample_key``.
- A request's samples are inserted together (``insert`` takes one free slot per sample) and
  preempted together (the running ones: a sample that finished keeps its completion). Re-inserted,
  a preempted request admits only the samples it had running.
- On a dense engine the samples are prefilled together, each in its own row. On paged memory the
  first sample admitted (the *leader*) prefills alone; the others *wait* (no page, no prefill)
  until its prompt is in the cache, then share its pages holding all of the prompt but its last
  token (``join``: one reference each), the partly filled last one copied before their first
  write (``pages.PagePool.copy``), and prefill only the rest: the prompt's last token and a
  resumed sample's own tokens.
- With the prefix cache, requests admitted in the same engine call share too: a request whose
  sequence agrees with that of a slot still prefilling (and not itself waiting) on at least a
  page more than the prefix cache holds waits for that slot the same way, and shares its pages
  holding the common prefix once they are written (``seat``): a prefix common to a batch is
  prefilled once, the waiting requests a call later. No page a request shares is written
  again by it before it is copied, so the output stays exact.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from decodelab.serving.paged import pages_for
from decodelab.serving.pool import PagedMemory
from decodelab.serving.prefix import common_length
from decodelab.serving.requests import Request, sample_key
from decodelab.serving.slots import Slot


def shared_prompt_pages(request: Request, page_size: int) -> int:
    """Full pages of ``request``'s prompt that its waiting samples share for good (its last
    token is always computed, as with the prefix cache; a partly filled page is copied)."""
    return (len(request.prompt) - 1) // page_size


def refused(request: Request, num_slots: int, memory: PagedMemory | None) -> str | None:
    """Why ``request``'s ``n`` samples can never be held together, or None: more samples than
    slots, or (paged memory) than the whole pool holds with the prompt's pages shared."""
    if request.n > num_slots:
        return f"n={request.n} samples need {request.n} slots, the engine has {num_slots}"
    if memory is None or request.n == 1:
        return None
    each = pages_for(len(request.prompt) + request.max_new_tokens, memory.page_size)
    need = each + (request.n - 1) * (each - shared_prompt_pages(request, memory.page_size))
    if need > memory.num_pages:
        return (f"n={request.n} samples need {need} pages of {memory.page_size} (the prompt's "
                f"full pages shared), more than the whole pool of {memory.num_pages}")
    return None


def resumed(resume: Mapping[Hashable, Slot], request: Request, sample: int) -> Slot | None:
    """The slot ``request``'s ``sample`` was preempted from (its output so far) among an
    engine's ``resume`` records (by ``Slot.key``), else None."""
    held = resume.get(sample_key(request.id, sample, request.n))
    return held if held is not None and held.request is request else None


def admitted(resume: Mapping[Hashable, Slot], request: Request) -> list[int]:
    """The samples of ``request`` an insert admits: those it had running when preempted, else
    all ``n``."""
    return [i for i in range(request.n) if resumed(resume, request, i)] or list(range(request.n))


def fitting(counts: Iterable[int], free: int) -> int:
    """How many requests from the head of a queue fit in ``free`` slots, ``counts`` being the
    slots (samples) each takes: first come, first served."""
    fit = 0
    for count in counts:
        free -= count
        if free < 0:
            break
        fit += 1
    return fit


def group(slots: Sequence[Slot | None], request: Request) -> list[int]:
    """The slots holding samples of ``request``, increasing."""
    return [i for i, held in enumerate(slots) if held is not None and held.request is request]


def preempt(slots: list[Slot | None], memory: PagedMemory, released: Sequence[int]
            ) -> list[tuple[int, Slot]]:
    """Empty the ``released`` slots (the pool's preemptions, their pages already dropped) and
    every other slot of their requests (dropping its pages): ``(slot, Slot)`` pairs, the
    requests in the order released."""
    taken = []
    for slot in released:
        if slots[slot] is None:  # taken out with an earlier sample of its request
            continue
        for other in group(slots, slots[slot].request):
            if other not in released:
                memory.release(other)
            taken.append((other, slots[other]))
            slots[other] = None
    return taken


def seat(slots: Sequence[Slot | None], place: int, memory: PagedMemory,
         first: Slot | None) -> None:
    """Start the just admitted ``slots[place]`` on paged memory: a further sample waits for
    ``first`` (its request's first sample); another request waits for the prefilling slot it
    agrees with longest when that gives a page more than the prefix cache, else it shares the
    recorded pages (module docstring)."""
    held = slots[place]
    if first is not None:
        held.leader, held.shares = first, len(held.request.prompt) - 1
        return
    leader, common = None, 0
    for other in slots if memory.prefix is not None else ():
        if other is None or other is held or other.waits or not other.prefilling:
            continue
        agree = min(common_length(other.sequence, held.sequence), len(held.sequence) - 1)
        if agree > common:
            leader, common = other, agree
    if common >= memory.cached(held.sequence)[1] + memory.page_size:
        held.leader, held.shares = leader, common
    else:
        held.prefilled = held.cached = memory.share(place, held.sequence)


def settle(slots: Sequence[Slot | None], memory: PagedMemory) -> None:
    """After an engine call: the prefix cache (if on) records every slot's full pages, then the
    waiting slots whose leaders hold what they share join them (``join``)."""
    for slot, held in enumerate(slots):
        if held is not None:
            memory.remember(slot, *held.in_cache())
    join(slots, memory)


def join(slots: Sequence[Slot | None], memory: PagedMemory) -> None:
    """Every waiting slot whose leader's cache holds what it shares takes those pages and
    prefills from there; one whose leader left before that (preempted) shares from the prefix
    cache instead (module docstring)."""
    joined = True
    while joined:  # a leader that joins may let its own waiters join
        joined = False
        for slot, held in enumerate(slots):
            if held is None or not held.waits:
                continue
            leader = next((i for i, s in enumerate(slots) if s is held.leader), None)
            if leader is not None and (held.leader.waits or held.leader.prefilled < held.shares):
                continue
            if leader is None:
                held.prefilled = held.cached = memory.share(slot, held.sequence)
            else:
                memory.share_from(slot, leader, held.shares)
                held.prefilled = held.cached = held.shares
            held.leader, joined = None, True
