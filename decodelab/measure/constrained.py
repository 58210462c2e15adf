"""How far per-token masking moves a model's output from its distribution conditioned on the
constraint (issue 33), what a pattern's automaton costs to build and hold, and what a
constrained decode step costs.

What each row holds and a caller may rely on:

- A *task* is a prompt (an instruction, in the model's chat template when it has one) and a
  pattern (a regex or a JSON schema, ``sampling.automaton.PATTERN_KINDS``). An *output* is what a
  row generates up to and including its end-of-sequence token; it is *complete* when it ends
  there, and it *matches* when its tokens walk the pattern's automaton from the start to an
  accepting state (the test masking itself applies, so the two sides agree on what matches).
- *Masked*: ``generate`` with the pattern at temperature 1; its incomplete rows (no accepting
  state within the budget) are counted and left out. *Exact*: the model's own distribution at
  temperature 1 conditioned on a complete match, estimated by rejection sampling (unconstrained
  outputs that match, each weight 1) when at least ``min_accepted`` of them match, otherwise by
  self-normalised importance weighting of a second, independent set of masked outputs with
  weights ``p(y) / q(y)`` (the unconstrained over the masked probability of the whole output).
- A task row keeps, per output, the string it decodes to (an index into ``strings``), its
  sampler (0 masked, 1 exact), its weight and its NLL and token count under the unconstrained
  model, so that a page resamples outputs (``distances``).
- Total variation and KL(exact || masked) are between the empirical distributions over output
  strings. TV uses the raw frequencies; KL adds ``ALPHA`` to the count of every string seen by
  either sampler, so a string one sampler never drew has a small, not a zero, probability.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.checks import check_int, check_one_of
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.measure import stats, timing
from decodelab.measure.perplexity import continuation_logprobs
from decodelab.sampling.params import SamplingParams

ALPHA = 0.5  # the pseudo-count KL adds to every string either sampler drew


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How many outputs a task draws and how: ``masked`` constrained and ``unconstrained``
    outputs, ``new_tokens`` at most each, ``batch_size`` rows per ``generate`` call, importance
    weighting below ``min_accepted`` matching unconstrained outputs."""

    masked: int
    unconstrained: int
    new_tokens: int
    batch_size: int = 64
    min_accepted: int = 100
    seed: int = 0

    def __post_init__(self):
        for name in ("masked", "unconstrained"):
            check_int(name, getattr(self, name), 2)
        for name in ("new_tokens", "batch_size", "min_accepted"):
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)


def prompt_ids(tokenizer: Any, instruction: str) -> list[int]:
    """``instruction`` as one user turn of the tokenizer's chat template, ready for the reply;
    encoded as plain text by a tokenizer without one."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": instruction}])
        return list(tokenizer.encode(text))
    return list(tokenizer.encode(instruction))


def accepts(automaton: Any, tokens: Sequence[int], eos_ids: Sequence[int]) -> bool:
    """Whether ``tokens`` (an output ending with an end-of-sequence id) walk ``automaton``
    (``sampling.automaton.Automaton``) from its start to an accepting state."""
    if not tokens or tokens[-1] not in eos_ids:
        return False
    moves = dict(zip(zip(automaton.source.tolist(), automaton.token.tolist()),
                     automaton.target.tolist()))
    state = 0
    for token in tokens[:-1]:
        state = moves.get((state, token))
        if state is None:
            return False
    return bool(automaton.accepting[state])


def _draw(model, prompt, params, count: int, sampling: Sampling, options: DecodeOptions,
          first_seed: int) -> tuple[list[list[int]], list[float], list[str]]:
    """``count`` outputs of ``prompt``: their tokens, log-probabilities under the distribution
    they were drawn from, and finish reasons."""
    tokens, logprobs, reasons = [], [], []
    for start in range(0, count, sampling.batch_size):
        rows = min(sampling.batch_size, count - start)
        seeds = [first_seed + start + i for i in range(rows)]
        out = generate(model, [prompt] * rows, params, sampling.new_tokens, seeds,
                       options=options)
        tokens += out.token_lists()
        logprobs += np.where(out.valid, out.logprobs, 0.0).sum(-1).tolist()
        reasons += out.finish_reason
    return tokens, logprobs, reasons


def task_row(model, tokenizer, kind: str, pattern: Any, instruction: str, sampling: Sampling,
             eos_ids: Sequence[int]) -> dict:
    """One task's outputs under masking and under the exact constrained distribution, as the
    module docstring says; the row's per-output columns are in ``outputs``."""
    from decodelab.sampling import automaton  # the ``structured`` extra, as generate imports it
    check_one_of("kind", kind, tuple(automaton.PATTERN_KINDS))
    eos = list(eos_ids)
    options = DecodeOptions(eos_ids=eos, tokenizer=tokenizer)
    machine = automaton.build(kind, pattern, tokenizer, model.config.vocab_size, eos)
    prompt = prompt_ids(tokenizer, instruction)
    free, masked = SamplingParams(temperature=1.0), SamplingParams(temperature=1.0,
                                                                   **{kind: pattern})
    base = sampling.seed * 10**6
    m_tokens, m_logq, m_reasons = _draw(model, prompt, masked, sampling.masked, sampling,
                                        options, base)
    u_tokens, _, _ = _draw(model, prompt, free, sampling.unconstrained, sampling, options,
                                base + sampling.masked)
    matched = [accepts(machine, t, eos) for t in u_tokens]
    masked_rows = [i for i, r in enumerate(m_reasons) if r == "eos"]
    if sum(matched) >= sampling.min_accepted:
        method = "rejection"
        e_tokens = [t for t, ok in zip(u_tokens, matched) if ok]
        e_weights = np.ones(len(e_tokens))
    else:
        method = "importance"
        i_tokens, i_logq, i_reasons = _draw(model, prompt, masked, sampling.masked, sampling,
                                            options, base + sampling.masked
                                            + sampling.unconstrained)
        kept = [i for i, r in enumerate(i_reasons) if r == "eos"]
        e_tokens = [i_tokens[i] for i in kept]
        logp = [float(lp.sum()) for lp in continuation_logprobs(model, [prompt] * len(kept),
                                                                 e_tokens)]
        log_w = np.asarray(logp) - np.asarray([i_logq[i] for i in kept])
        e_weights = np.exp(log_w - log_w.max()) if kept else np.zeros(0)
    m_kept = [m_tokens[i] for i in masked_rows]
    scored = continuation_logprobs(model, [prompt] * (len(m_kept) + len(e_tokens)),
                                   m_kept + e_tokens) if m_kept + e_tokens else []
    texts = [tokenizer.decode([t for t in out if t not in eos]) for out in m_kept + e_tokens]
    strings = list(dict.fromkeys(texts))
    index = {s: i for i, s in enumerate(strings)}
    weights = np.concatenate([np.ones(len(m_kept)), e_weights])
    return {
        "exact_method": method, "masked_incomplete": len(m_tokens) - len(m_kept),
        "unconstrained_valid": [float(ok) for ok in matched],
        "unconstrained_matched": int(sum(matched)), "strings": len(strings),
        "outputs": {"string": [index[t] for t in texts],
                    "sampler": [0] * len(m_kept) + [1] * len(e_tokens),
                    "weight": (weights / weights[len(m_kept):].mean()).tolist()
                    if len(e_tokens) else weights.tolist(),
                    "nll": [-float(lp.sum()) for lp in scored],
                    "tokens": [len(lp) for lp in scored]},
    }


# --- Distances over output strings, resampled by output --------------------------------------------


def _histograms(string, sampler, weight, strings: int) -> tuple[np.ndarray, np.ndarray]:
    """Per resample, each sampler's weighted count of every string: ``[..., n]`` -> two
    ``[R, K]`` (R the resamples, 1 for unresampled columns)."""
    string, sampler, weight = (np.atleast_2d(np.asarray(a)) for a in (string, sampler, weight))
    R = string.shape[0]
    key = (np.arange(R)[:, None] * strings + string.astype(np.int64)).ravel()

    def counts(side):
        w = (weight * (sampler == side)).ravel()
        return np.bincount(key, weights=w, minlength=R * strings).reshape(R, strings)

    return counts(0), counts(1)


def total_variation(strings: int) -> stats.Statistic:
    """The statistic ``(string, sampler, weight) [..., n] -> [...]``: half the L1 distance
    between the two samplers' normalised string frequencies."""
    def statistic(string, sampler, weight):
        masked, exact = _histograms(string, sampler, weight, strings)
        with np.errstate(invalid="ignore", divide="ignore"):
            tv = 0.5 * np.abs(masked / masked.sum(-1, keepdims=True)
                              - exact / exact.sum(-1, keepdims=True)).sum(-1)
        return tv.reshape(np.shape(string)[:-1])
    return statistic


def kl_exact_masked(strings: int, alpha: float = ALPHA) -> stats.Statistic:
    """The statistic KL(exact || masked) in nats, each sampler's counts plus ``alpha`` on every
    one of the ``strings`` strings seen by either."""
    def statistic(string, sampler, weight):
        masked, exact = _histograms(string, sampler, weight, strings)
        q = (masked + alpha) / (masked + alpha).sum(-1, keepdims=True)
        p = (exact + alpha) / (exact + alpha).sum(-1, keepdims=True)
        return (p * np.log(p / q)).sum(-1).reshape(np.shape(string)[:-1])
    return statistic


def _columns(row: Mapping[str, Any], *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(row["outputs"][name], np.float64) for name in names)


def distances(row: Mapping[str, Any]) -> dict[str, stats.Interval | None]:
    """A task row's ``tv`` and ``kl`` with bootstrap intervals, resampling its outputs (both
    samplers pooled); None where a sampler kept fewer than two outputs."""
    sampler = np.asarray(row["outputs"]["sampler"])
    if min(np.sum(sampler == 0), np.sum(sampler == 1)) < 2:
        return {"tv": None, "kl": None}
    columns = _columns(row, "string", "sampler", "weight")
    K = int(row["strings"])
    return {"tv": stats.bootstrap(total_variation(K), columns),
            "kl": stats.bootstrap(kl_exact_masked(K), columns)}


def perplexity(row: Mapping[str, Any], side: int) -> stats.Interval | None:
    """The unconstrained model's perplexity of one sampler's outputs (0 masked, 1 exact; the
    exact side weighted), with its bootstrap interval over those outputs."""
    sampler, weight, nll, tokens = _columns(row, "sampler", "weight", "nll", "tokens")
    mine = sampler == side
    if mine.sum() < 2:
        return None
    return stats.bootstrap(stats.perplexity, (weight[mine] * nll[mine],
                                              weight[mine] * tokens[mine]))


def validity(row: Mapping[str, Any]) -> stats.Interval | None:
    """The share of unconstrained outputs that are complete matches, with its interval."""
    valid = np.asarray(row["unconstrained_valid"], np.float64)
    return stats.bootstrap(stats.mean, valid) if valid.size >= 2 else None


# --- The automaton rows and the speed rows --------------------------------------------------------


def automaton_row(tokenizer, vocab_size: int, eos_ids: Sequence[int],
                  patterns: Mapping[str, tuple[str, Any]], clock: Callable[[], float]
                  = time.perf_counter) -> dict:
    """Per named ``(kind, pattern)``: the seconds to compile it into a device table over the
    tokenizer's vocabulary from an empty builder cache, its states, transitions and table
    bytes (and whether its next states are dense)."""
    from decodelab.sampling import automaton
    row = {}
    for name, (kind, pattern) in patterns.items():
        automaton.clear_cache()
        start = clock()
        table, _ = automaton.table([(kind, pattern)], tokenizer, vocab_size, list(eos_ids))
        row[f"{name}_build_s"] = clock() - start
        built = automaton.build(kind, pattern, tokenizer, vocab_size, list(eos_ids))
        row.update({f"{name}_states": built.num_states, f"{name}_edges": int(built.source.size),
                    f"{name}_table_bytes": int(table.nbytes), f"{name}_dense": not table.sparse})
    return row


def speed_row(model, tokenizer, kind: str, pattern: Any, prompts: np.ndarray, new_tokens: int,
              repeats: int, eos_ids: Sequence[int]) -> dict:
    """A constrained decode step against the same step unconstrained (greedy, EOS banned for
    ``new_tokens`` so every row decodes the whole budget), each timed by
    ``timing.time_generate``: the medians and the repetitions' seconds of both."""
    options = DecodeOptions(eos_ids=list(eos_ids), tokenizer=tokenizer)
    free = SamplingParams(temperature=0.0, min_new_tokens=new_tokens)
    constrained = dataclasses.replace(free, **{kind: pattern})
    row = {}
    for name, params in (("free", free), ("constrained", constrained)):
        timed = timing.time_generate(model, prompts, new_tokens, repeats, params,
                                     options=options)
        row.update({f"{name}_{k}": v for k, v in timed.items()})
    row["constrained_vs_free"] = timing.ratio(row["constrained_step_ms"],
                                              row["free_step_ms"] or None)
    return row


def step_seconds(wholes: np.ndarray, prefills: np.ndarray) -> np.ndarray:
    """The statistic: median whole call minus median prefill-only call (the decode steps)."""
    return stats.median(wholes) - stats.median(prefills)


def step_ratio(row: Mapping[str, Any]) -> stats.Interval:
    """A speed row's constrained over free step time, resampling each program's repetitions."""
    return stats.bootstrap_ratio(step_seconds, *((row[f"{name}_generate_reps_s"],
                                                  row[f"{name}_prefill_reps_s"])
                                                 for name in ("constrained", "free")))
