"""Logits processors: one class per processor, each owning its parameter; one registry fixes
their order.

Conventions (every processor relies on them):

- Logits are float32 ``[B, V]``. A processor removes a token by setting its logit to ``-inf`` and
  never removes every token: each truncation keeps at least the most probable one.
- A processor reads its per-row setting from ``RowParams`` (defined here) under its
  ``Parameter``'s name. The parameter's neutral value makes the processor exactly the identity for
  that row.
- What a compiled program contains is decided on the host, from the values, by ``Plan``: a
  processor neutral in every row is not in the program at all; one enabled in every row is applied
  to every row; one enabled in some rows is applied and its rows selected with ``where``. When
  every row is greedy (temperature 0) the truncations after temperature are left out (they keep
  the one token greedy keeps). The plan is static: a sweep over the *values* of the enabled
  processors runs one program, and a different *set* (a processor switched on or off in every row,
  greedy against sampled) compiles one more. A state whose rows change parameters (the serving
  engine) runs under the ``union`` of the plans its rows may hold: every processor any of them
  enables, each applied with the per-row ``where``. ``Plan.ANY`` traces every processor and skips
  one that no row enables at run time (``lax.cond``).
- Top-k and top-p look at the ``Plan.candidates`` largest logits (``lax.top_k``) and fall back to
  sorting the whole vocabulary only when some row needs more (``lax.cond``); both give exactly
  the kept set of the full sort.
- Adding a processor is one class (its ``parameter`` and its ``apply``) plus one line in
  ``PROCESSORS``: ``SamplingParams`` and ``RowParams`` take their fields, defaults, validation and
  storage dtype from the registry.

The processor order (``PROCESSORS``) is fixed:

  1. repetition penalty     6. temperature (0 = greedy)    11. typical-p
  2. frequency penalty      7. top-n-sigma                 12. epsilon cutoff
  3. presence penalty       8. top-k                       13. eta cutoff
  4. no-repeat-n-gram       9. top-p
  5. logit bias / banned   10. min-p
     and min-new-tokens

Penalties and bans act on the model's scores, before any reshaping, as in CTRL and the OpenAI
API. Min-new-tokens sits with the bans (it bans EOS) and before temperature, so greedy never picks
a suppressed EOS. Top-n-sigma comes first among the truncations because its statistic (the
standard deviation of the logits, Tang et al. 2024) is defined over the whole vocabulary; after
top-k it would be the spread of a handful of survivors. Its kept set does not depend on the
temperature (max and sigma scale alike), so its place relative to temperature is immaterial.
The remaining truncations follow the order of Hugging Face's and vLLM's samplers.

Ties: greedy (temperature 0) and top-k keep the lowest token id among tied logits, so
``top_k=1`` is greedy decoding; top-p, typical-p and the probability cutoffs keep every token tied
with the last one kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
from flax import struct

from decodelab.sampling.base import LogitsProcessor
from decodelab.sampling.inputs import Parameter, Plan
from decodelab.sampling.penalties import (FrequencyPenalty, LogitBias, MinNewTokens, NoRepeatNgram,
                                          PresencePenalty, RepetitionPenalty)
from decodelab.sampling.truncation import (EpsilonCutoff, EtaCutoff, MinP, Temperature, TopK,
                                           TopNSigma, TopP, TypicalP)

# The registry: the pipeline order, and (through each processor's parameter) the fields of
# SamplingParams and RowParams.
PROCESSORS: tuple[LogitsProcessor, ...] = (
    RepetitionPenalty(),
    FrequencyPenalty(),
    PresencePenalty(),
    NoRepeatNgram(),
    LogitBias(),
    MinNewTokens(),
    Temperature(),
    TopNSigma(),
    TopK(),
    TopP(),
    MinP(),
    TypicalP(),
    EpsilonCutoff(),
    EtaCutoff(),
)


def planned(plan: Plan) -> tuple[LogitsProcessor, ...]:
    """The processors a program under ``plan`` contains, in pipeline order."""
    return plan.select(PROCESSORS)


def union(plans: Sequence[Plan]) -> Plan:
    """The plan of a state whose rows may hold what any of ``plans`` serves: every processor one
    of them contains, in pipeline order, none applied without the per-row ``where`` (a row may
    enable it or not), greedy only if all are. ``union(plans).covers(p)`` for each ``p``."""
    if not plans:
        raise ValueError("plans must hold at least one Plan, got none")
    candidates = {plan.candidates for plan in plans}
    if len(candidates) > 1:
        raise ValueError(f"plans must share one candidate cap, got {sorted(candidates)}")
    greedy = all(plan.greedy for plan in plans)
    if any(plan.active is None for plan in plans):
        return dataclasses.replace(Plan.ANY, greedy=greedy, candidates=candidates.pop())
    names = {name for plan in plans for name in plan.active}
    return Plan(active=tuple(p.name for p in PROCESSORS if p.name in names), greedy=greedy,
                candidates=candidates.pop())


# name -> Parameter, in pipeline order.
PARAMETERS: dict[str, Parameter] = {p.parameter.name: p.parameter for p in PROCESSORS
                                    if p.parameter is not None}
# The parameters of the processors that read the history.
HISTORY_PARAMETERS: dict[str, Parameter] = {p.parameter.name: p.parameter for p in PROCESSORS
                                            if p.parameter is not None and p.reads_history}


def _row_fields(cls: type) -> type:
    """Give ``cls`` one ``[B]`` array field per registered parameter, before its own fields."""
    cls.__annotations__ = {**{name: "jax.Array" for name in PARAMETERS}, **cls.__annotations__}
    cls.__doc__ += "".join(f"\n    {name}: [B] {p.dtype}" for name, p in PARAMETERS.items())
    return cls


@struct.dataclass(kw_only=True)
@_row_fields
class RowParams:
    """``SamplingParams`` as arrays, one value per row: the form the decode loop traces.

    Fields: ``logit_bias``, ``plan`` (static: which processors the program contains) and one
    per registered parameter:
    """

    logit_bias: jax.Array  # [B, V] float32, -inf for a banned token; read only if LogitBias is on
    plan: Plan = struct.field(pytree_node=False, default=Plan.ANY)

    def with_plan(self, plan: Plan) -> RowParams:
        """These values under ``plan``, which must serve them (``Plan.covers``): a wider plan for
        a state whose rows change parameters (``processors.union``), or ``Plan.ANY``."""
        if not plan.covers(self.plan):
            raise ValueError(f"plan must cover the plan of these values, {self.plan}, got {plan}")
        return self.replace(plan=plan)
