"""What the compression studies (quantization, pruning) measure besides the scoreboard itself: the
token windows they score and time, interleaved timing of a candidate against its reference, the
self-draft row, llama.cpp's logits scored as a peer (with its decode speed), and per-layer
values kept in a row.

The rows these fill hold, per batch size B:

- ``reference_reps_s_b<B>``, ``reps_s_b<B>``: each timed run's seconds, in run order (run i of the
  reference and of the candidate back to back, after a warm-up run of each, compilation excluded);
- ``speedup_b<B>``: the reference's median seconds over the candidate's;
- ``tokens_per_s_b<B>``: the candidate's output tokens over its median seconds.

The scoreboard fields are those of ``decodelab.measure.scoreboard.compare``
(``Scoreboard.as_dict``).
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
from collections.abc import Callable, Sequence

import numpy as np

from decodelab import optional
from decodelab.compress.quantization import parameter_bytes, quantize
from decodelab.decode.generation import generate
from decodelab.measure import llama_cpp
from decodelab.measure.peers import time_llama_cpp
from decodelab.measure.scoreboard import compare
from decodelab.measure.timing import timed
from decodelab.sampling.params import SamplingParams
from decodelab.speculative.generation import speculative_generate

MISSING_LLAMA_CPP = "not run: llama-cpp-python is not installed (pip install -e .[llamacpp])"


def timed_pair(reference: Callable, candidate: Callable, repeats: int,
               B: int) -> tuple[dict, float]:
    """``repeats`` runs of ``reference()`` and ``candidate()``, interleaved after a warm-up run of
    each: the row's ``reference_reps_s_b<B>``, ``reps_s_b<B>`` and ``speedup_b<B>`` (median over
    median), and the candidate's median seconds."""
    reference(), candidate()
    pairs = [(timed(reference), timed(candidate)) for _ in range(repeats)]
    ref, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    return ({f"reference_reps_s_b{B}": ref, f"reps_s_b{B}": cand,
             f"speedup_b{B}": statistics.median(ref) / statistics.median(cand)},
            statistics.median(cand))


def time_decoding(reference, candidate, prompts: Sequence[Sequence[int]],
                  batch_sizes: Sequence[int], new_tokens: int, repeats: int, *,
                  kv_cache: str | None = None,
                  status: Callable[[str], None] = lambda text: None) -> dict:
    """The row's decode-speed fields at each batch size B: greedy ``generate`` of ``new_tokens``
    tokens for the first B ``prompts``, ``candidate`` (with ``kv_cache``) against ``reference``
    (``timed_pair``), ``tokens_per_s_b<B>`` first."""
    greedy, row = SamplingParams.greedy(), {}
    for B in batch_sizes:
        status(f"decode batch {B}")
        timed, median = timed_pair(
            lambda: generate(reference, prompts[:B], greedy, new_tokens).tokens,
            lambda: generate(candidate, prompts[:B], greedy, new_tokens,
                             kv_cache=kv_cache).tokens,
            repeats, B)
        row[f"tokens_per_s_b{B}"] = B * new_tokens / median
        row.update(timed)
    return row


def time_self_draft(model, prompts: Sequence[Sequence[int]], gamma: int, new_tokens: int,
                    repeats: int, seed: int) -> dict:
    """Greedy ``speculative_generate`` of ``model`` drafting with its own int4 g32 copy, one
    prompt, against ``model``'s ``generate``: ``alpha`` (accepted / tested proposals, of the
    warm-up run), ``tokens_per_s_b1``, the runs' seconds and ``speedup_b1``, and both models'
    parameter bytes."""
    greedy = SamplingParams.greedy()
    draft = quantize(model, weights="int4", group_size=32)
    outputs = []

    def run_spec():
        outputs.append(speculative_generate(model, draft, prompts[:1], greedy, gamma, new_tokens,
                                            seed=seed))
        return outputs[-1].tokens

    timed, median = timed_pair(lambda: generate(model, prompts[:1], greedy, new_tokens).tokens,
                               run_spec, repeats, 1)
    return {"alpha": outputs[0].stats.overall_alpha, "tokens_per_s_b1": new_tokens / median,
            **timed, "parameter_bytes": parameter_bytes(model),
            "draft_parameter_bytes": parameter_bytes(draft)}


def llama_cpp_scoreboard(model, source: pathlib.Path, windows: np.ndarray,
                         prompt: Sequence[int], new_tokens: int, repeats: int, *,
                         ftype: str | None) -> dict:
    """The scoreboard of llama.cpp's logits on ``windows`` against ``model`` (decodelab's
    reference), read from the GGUF file ``source`` as stored (``ftype`` None) or from llama.cpp's
    own conversion of it (``llama_cpp.convert``: "f32", "q8_0", "q4_0", "q4_k_m"), with its
    greedy decode speed at batch 1 (``peers.time_llama_cpp``: ``new_tokens`` after ``prompt``,
    ``repeats`` runs: ``tokens_per_s_b1``, ``reps_s_b1``); ``parameter_bytes``: the file's tensor
    bytes. Without the ``llamacpp`` extra, a row that says so (``note``)."""
    try:
        module = optional.require("llama_cpp")
    except optional.MissingExtra:
        return {"note": MISSING_LLAMA_CPP}
    with tempfile.TemporaryDirectory() as scratch:
        path = (source if ftype is None else
                llama_cpp.convert(source, pathlib.Path(scratch) / f"{ftype}.gguf", ftype))
        board = compare(model, lambda batch: llama_cpp.logits(path, np.asarray(batch)), windows)
        timed = time_llama_cpp(path, np.asarray(prompt), new_tokens, repeats)
        file_bytes = llama_cpp.gguf_tensor_bytes(path)
    return {**board.as_dict(), "parameter_bytes": file_bytes, "llama_version": module.__version__,
            "tokens_per_s_b1": timed["tokens_per_s"], "reps_s_b1": timed["generate_reps_s"]}


def by_layer(array) -> dict[str, list]:
    """``[L, X]`` as a row's per-unit metric: ``{"0": [...], "1": [...], ...}``, one list per
    layer (a row holds numbers, lists of numbers or dicts of lists)."""
    return {str(layer): np.asarray(values).tolist() for layer, values in enumerate(array)}


def layers(metric: dict[str, list]) -> np.ndarray:
    """``by_layer``'s dict back as ``[L, X]``."""
    return np.asarray([metric[key] for key in sorted(metric, key=int)])
