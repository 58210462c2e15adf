"""How far per-token masking moves a model's output from its distribution conditioned on the
constraint (issue 33), what a pattern's automaton costs to build and hold, and what a
constrained decode step costs.

What each row holds and a caller may rely on:

- A *task* is a prompt (an instruction, in the model's chat template when it has one) and a
  pattern (a regex or a JSON schema, ``sampling.automaton.PATTERN_KINDS``). An *output* is what a
  row generates up to and including its end-of-sequence token; it is *complete* when it ends
  there within the budget, and it *matches* when its tokens walk the pattern's automaton from the
  start to an accepting state (the test masking itself applies).
- *Masked* (q): ``generate`` with the pattern at temperature 1; a complete masked output always
  matches. *Exact* (p*): the model's own distribution p at temperature 1 conditioned on a
  complete match. Both are compared over complete outputs (q restricted to them, q_c).
- Every complete masked output y carries its importance weight ``w = p(y) / q(y)``, from the
  log-probabilities the masked sampler recorded and the unconstrained model's score of the same
  tokens. Since q covers every output p* can produce (the automaton is trimmed, so masking only
  removes tokens that cannot end in a match), with m(w) the mean weight over complete outputs:
  ``p*(y) / q_c(y) = w / m(w)``, so TV = ½·mean|w/m(w) − 1|, KL(p*‖q_c) = Σ π log w − log m(w)
  (π the self-normalised weights) and KL(q_c‖p*) = log m(w) − mean(log w), all over complete
  masked outputs alone: no histogram over output strings, so a large output space does not bias
  them. The probability that p itself produces a complete match is ``mean(w · complete)`` over
  all masked outputs; a separate set of unconstrained outputs measures it directly
  (``unconstrained_valid``), a check of the weights.
- Intervals resample outputs (``distances``); the effective sample size of the weights,
  ``(Σw)² / Σw²``, says how many outputs the exact side effectively rests on.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.checks import check_int, check_one_of
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.measure import sampling_cost, stats, timing
from decodelab.measure.perplexity import continuation_logprobs
from decodelab.sampling.params import SamplingParams

@dataclasses.dataclass(frozen=True)
class Sampling:
    """How many outputs a task draws and how: ``masked`` constrained and ``unconstrained``
    outputs, ``new_tokens`` at most each, ``batch_size`` rows per ``generate`` call."""

    masked: int
    unconstrained: int
    new_tokens: int
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        for name in ("masked", "unconstrained"):
            check_int(name, getattr(self, name), 2)
        for name in ("new_tokens", "batch_size"):
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
    """One task's masked outputs with their importance weights and the unconstrained outputs'
    match rate, as the module docstring says; the per-output columns are in ``outputs``."""
    from decodelab.sampling import automaton  # the ``structured`` extra, as generate imports it
    check_one_of("kind", kind, tuple(automaton.PATTERN_KINDS))
    eos = list(eos_ids)
    options = DecodeOptions(eos_ids=eos, tokenizer=tokenizer)
    machine = automaton.build(kind, pattern, tokenizer, model.config.vocab_size, eos)
    prompt = prompt_ids(tokenizer, instruction)
    free, masked = SamplingParams(temperature=1.0), SamplingParams(temperature=1.0,
                                                                   **{kind: pattern})
    base = sampling.seed * 10**6
    tokens, logq, reasons = _draw(model, prompt, masked, sampling.masked, sampling, options, base)
    u_tokens, _, _ = _draw(model, prompt, free, sampling.unconstrained, sampling, options,
                           base + sampling.masked)
    complete = [r == "eos" for r in reasons]
    kept = [t for t, done in zip(tokens, complete) if done]
    scored = iter(continuation_logprobs(model, [prompt] * len(kept), kept) if kept else [])
    log_w, nll, counts = [], [], []
    for lq, out, done in zip(logq, tokens, complete):
        logp = float(next(scored).sum()) if done else 0.0
        log_w.append(logp - lq if done else 0.0)
        nll.append(-logp)
        counts.append(len(out) if done else 0)
    texts = [tokenizer.decode([t for t in out if t not in eos]) for out in kept]
    return {
        "unconstrained_valid": [float(accepts(machine, t, eos)) for t in u_tokens],
        "strings": len(set(texts)), "examples": _most_common(texts, 5),
        "outputs": {"complete": [float(done) for done in complete], "log_w": log_w, "nll": nll,
                    "tokens": counts},
    }


def _most_common(texts: Sequence[str], k: int) -> str:
    """The ``k`` most frequent texts with their counts, most frequent first, as the JSON text
    of ``[[text, count], ...]`` (a row's metric is a number or a text)."""
    return json.dumps(collections.Counter(texts).most_common(k), ensure_ascii=False)


# --- Distances from the importance weights, resampled by output --------------------------------


def _normalised(log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w / max w, log of max w) along the last axis: weights scaled so none overflows."""
    top = log_w.max(-1, keepdims=True)
    return np.exp(log_w - top), top[..., 0]


def total_variation(log_w: np.ndarray) -> np.ndarray:
    """½·mean|w / mean(w) − 1| over complete outputs ``[..., n]``: TV(p*, q_c)."""
    w, _ = _normalised(log_w)
    return 0.5 * np.abs(w / w.mean(-1, keepdims=True) - 1.0).mean(-1)


def kl_exact_masked(log_w: np.ndarray) -> np.ndarray:
    """KL(p* ‖ q_c) in nats: the self-normalised mean of log w less log mean(w)."""
    w, top = _normalised(log_w)
    pi = w / w.sum(-1, keepdims=True)
    return (pi * log_w).sum(-1) - (np.log(w.mean(-1)) + top)


def kl_masked_exact(log_w: np.ndarray) -> np.ndarray:
    """KL(q_c ‖ p*) in nats: log mean(w) less the mean of log w."""
    w, top = _normalised(log_w)
    return np.log(w.mean(-1)) + top - log_w.mean(-1)


def match_rate(log_w: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """The probability that the unconstrained model produces a complete match, by importance
    weighting: mean(w · complete) over every masked output."""
    return (np.exp(log_w) * complete).mean(-1)


def effective_size(row: Mapping[str, Any]) -> float:
    """The weights' effective sample size (Σw)² / Σw² over complete outputs (0 if none)."""
    log_w = _complete(row, "log_w")[0]
    if not log_w.size:
        return 0.0
    w, _ = _normalised(log_w)
    return float(w.sum() ** 2 / (w ** 2).sum())


def _complete(row: Mapping[str, Any], *names: str) -> tuple[np.ndarray, ...]:
    """The named per-output columns of the complete outputs."""
    done = np.asarray(row["outputs"]["complete"], bool)
    return tuple(np.asarray(row["outputs"][name], np.float64)[done] for name in names)


DISTANCES = {"tv": total_variation, "kl": kl_exact_masked, "kl_reverse": kl_masked_exact}


def distances(row: Mapping[str, Any]) -> dict[str, stats.Interval | None]:
    """A task row's ``tv``, ``kl`` (exact ‖ masked) and ``kl_reverse`` with bootstrap intervals
    over its complete masked outputs; None where fewer than two are complete."""
    (log_w,) = _complete(row, "log_w")
    if log_w.size < 2:
        return dict.fromkeys(DISTANCES)
    return {name: stats.bootstrap(statistic, log_w) for name, statistic in DISTANCES.items()}


def weighted_match_rate(row: Mapping[str, Any]) -> stats.Interval | None:
    """``match_rate`` with its interval over every masked output."""
    columns = tuple(np.asarray(row["outputs"][k], np.float64) for k in ("log_w", "complete"))
    return stats.bootstrap(match_rate, columns) if columns[0].size >= 2 else None


def perplexity(row: Mapping[str, Any], exact: bool) -> stats.Interval | None:
    """The unconstrained model's perplexity of the complete masked outputs, as drawn
    (``exact=False``) or weighted into the exact distribution, with its bootstrap interval."""
    log_w, nll, tokens = _complete(row, "log_w", "nll", "tokens")
    if log_w.size < 2:
        return None
    if not exact:
        return stats.bootstrap(stats.perplexity, (nll, tokens))

    def weighted(log_w, nll, tokens):
        w, _ = _normalised(log_w)
        return stats.perplexity(w * nll, w * tokens)
    return stats.bootstrap(weighted, (log_w, nll, tokens))


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
              repeats: int) -> dict:
    """A constrained decode step against the same step unconstrained (greedy, the tokenizer's
    EOS banned for ``new_tokens`` so every row decodes the whole budget), their repetitions
    interleaved (``sampling_cost.time_programs``): the medians and the repetitions' seconds of
    both (``free_*``, ``constrained_*``) and the ratio of the median steps."""
    free = SamplingParams(temperature=0.0, min_new_tokens=new_tokens)
    programs = {"free": free, "constrained": dataclasses.replace(free, **{kind: pattern})}
    row = sampling_cost.time_programs(model, prompts, programs, new_tokens, repeats,
                                      DecodeOptions(eos_ids=[tokenizer.eos_id],
                                                    tokenizer=tokenizer))
    row["constrained_vs_free"] = timing.ratio(row["constrained_step_ms"],
                                              row["free_step_ms"] or None)
    return row


def step_seconds(wholes: np.ndarray, prefills: np.ndarray) -> np.ndarray:
    """The statistic: median whole call minus median prefill-only call (the decode steps)."""
    return stats.median(wholes) - stats.median(prefills)


def step_ratio(row: Mapping[str, Any]) -> stats.Interval:
    """A speed row's constrained over free step time; the two were timed in the same rounds
    (``speed_row``), so their repetitions are resampled together by round."""
    return stats.bootstrap_ratio(step_seconds, *((row[f"{name}_generate_reps_s"],
                                                  row[f"{name}_prefill_reps_s"])
                                                 for name in ("constrained", "free")),
                                 paired=True)
