"""Logits processors: one class per processor, each owning its parameter; one registry fixes
their order.

Conventions (every processor relies on them):

- Logits are float32 ``[B, V]``. A processor removes a token by setting its logit to ``-inf`` and
  never removes every token: each truncation keeps at least the most probable one.
- A processor reads its per-row setting from ``RowParams`` (defined here) under its
  ``Parameter``'s name. The parameter's neutral value makes the processor exactly the identity for
  that row.
- Every compiled program contains every processor (one program for every setting): which
  processors a row enables is data, like their values. A processor that no row of the batch
  enables is skipped at run time (a ``lax.cond`` on its enabled flags), one that some rows enable
  is applied and its rows selected with ``where``. The decode loops choose between the argmax
  (every running row greedy) and the sampled draw the same way, at run time, after running the
  processors before temperature once for both (``distribution.score``): a program holds each
  processor once per place that samples, which keeps its compile time down.
- Top-k, top-p and typical-p find their cut without sorting the vocabulary (``select``: a
  bounded search of masked sums over the integer image of the float32 values), exactly the set
  the sort-based definition keeps, ties included.
- Adding a processor is one class (its ``parameter`` and its ``apply``) plus one line in
  ``PROCESSORS``: ``SamplingParams`` and ``RowParams`` take their fields, defaults, validation and
  storage dtype from the registry.

The processor order (``PROCESSORS``) is fixed:

  1. repetition penalty     6. logit bias / banned       11. min-p
  2. frequency penalty         and min-new-tokens        12. typical-p
  3. presence penalty       7. temperature (0 = greedy;  13. epsilon cutoff
  4. DRY                       or dynamic)               14. eta cutoff
  5. no-repeat-n-gram       8. top-n-sigma               15. XTC (a mixture)
                            9. top-k                     16. Mirostat (v1 or v2)
                           10. top-p

Penalties and bans act on the model's scores, before any reshaping, as in CTRL and the OpenAI
API. Min-new-tokens sits with the bans (it bans EOS) and before temperature, so greedy never picks
a suppressed EOS. Top-n-sigma comes first among the truncations because its statistic (the
standard deviation of the logits, Tang et al. 2024) is defined over the whole vocabulary; after
top-k it would be the spread of a handful of survivors. Its kept set does not depend on the
temperature (max and sigma scale alike), so its place relative to temperature is immaterial.
The remaining truncations follow the order of Hugging Face's and vLLM's samplers. Mirostat
comes last: it reads each row's ``mu`` (``History.mirostat_mu``), which the loops move by the
surprise of each token drawn from its output (``mirostat``; llama.cpp runs it after temperature
alone, skipping its other samplers, which decodelab applies first where a row enables them).
A processor may own further settings (``settings``: DRY's base and window, XTC's threshold,
Mirostat's tau and eta): they are fields like its ``parameter``, which alone says whether it is
on.

llama.cpp's samplers (its ``common/sampling.cpp`` chain: penalties, DRY, top-n-sigma, top-k,
typical-p, top-p, min-p, XTC, temperature last) sit where decodelab's order puts them: DRY with
the penalties, on the model's scores (so greedy rows see it, as they see the repetition penalty);
dynamic temperature in ``Temperature``, before the truncations, where llama.cpp's is last (its
entropy is then over the survivors of the truncations, here over every allowed token); XTC after
every truncation (an exact mixture that must follow them; only Mirostat, which truncates what it
is given, comes after it), and over the distribution after temperature (llama.cpp's XTC reads
the probabilities before its temperature: the two agree at temperature 1). Each agrees with llama.cpp's own sampler on the same logits and history.

Ties: greedy (temperature 0) and top-k keep the lowest token id among tied logits, so
``top_k=1`` is greedy decoding; top-p, typical-p and the probability cutoffs keep every token tied
with the last one kept.
"""

from __future__ import annotations

import jax
from flax import struct

from decodelab.sampling.base import LogitsProcessor
from decodelab.sampling.inputs import Parameter
from decodelab.sampling.mirostat import Mirostat
from decodelab.sampling.penalties import (Dry, FrequencyPenalty, LogitBias, MinNewTokens,
                                          NoRepeatNgram, PresencePenalty, RepetitionPenalty)
from decodelab.sampling.truncation import (EpsilonCutoff, EtaCutoff, MinP, Temperature, TopK,
                                           TopNSigma, TopP, TypicalP, Xtc)

# The registry: the pipeline order, and (through each processor's parameter) the fields of
# SamplingParams and RowParams.
PROCESSORS: tuple[LogitsProcessor, ...] = (
    RepetitionPenalty(),
    FrequencyPenalty(),
    PresencePenalty(),
    Dry(),
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
    Xtc(),
    Mirostat(),  # last: it learns from the surprise of the token drawn from its output
)


# name -> Parameter, in pipeline order.
PARAMETERS: dict[str, Parameter] = {q.name: q for p in PROCESSORS for q in p.parameters}
# The parameters that turn on the processors that read the history.
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

    Fields: ``logit_bias``, ``biased`` and one per registered parameter (every one an array: no value is
    static, so no setting compiles a program of its own):
    """

    logit_bias: jax.Array  # [B, V] float32, -inf for a banned token; read only if LogitBias is on
    biased: jax.Array  # [B] bool, the rows whose bias is not all 0 (LogitBias's flag, set once)
    dry_breakers: jax.Array  # [B, V] bool, DRY's sequence breakers (``sampling.breakers``)
