"""What sampling costs beside greedy: one ``generate`` per setting on the same rows and model.

``SETTINGS`` are the sampling settings the decode-speed page judges (issue "sampling at the cost
of greedy"): temperature 1.0 alone; top-p 0.95 at temperature 1.0 (on a flat distribution it keeps
thousands of tokens); top-k 50; min-p 0.05; all four together; and the history processors
(repetition penalty 1.2 plus frequency penalty 0.5, greedy, so the difference is their cost).
``time_settings`` times greedy and each setting (the same rows, the same compiled program:
parameters are data) by ``time_programs``, their repetitions interleaved, and keeps each one's
repetitions under its own prefix (``<setting>_generate_reps_s``, ``<setting>_prefill_reps_s``),
from which the page's step ratios and their intervals are formed (``report.speed.step_ratio``). With the ``peer``
extra it also times transformers on ``PEER_SETTING`` with the same processors.

``SAMPLERS`` are llama.cpp's samplers (issue "the samplers and decoding methods the field uses"),
each at temperature 1.0 with llama.cpp's usual values (DRY's breakers as token ids, which cost
what tokenized strings do: the table is data); ``time_samplers`` times them and contrastive
search (``CONTRASTIVE``: alpha 0.6, k 4, a k-wide step) beside greedy in the same way.
"""

from __future__ import annotations

import functools

import numpy as np

from decodelab.decode.contrastive import contrastive_search
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.measure import peers, timing
from decodelab.model import Transformer
from decodelab.sampling.params import SamplingParams

SETTINGS: dict[str, dict] = {
    "temperature": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.95),
    "top_k": dict(top_k=50),
    "min_p": dict(min_p=0.05),
    "all": dict(temperature=1.0, top_k=50, top_p=0.95, min_p=0.05),
    "history": dict(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.5),
}
# Words for each setting on the page.
LABELS = {"temperature": "temperature 1.0", "top_p": "top-p 0.95", "top_k": "top-k 50",
          "min_p": "min-p 0.05", "all": "all four together",
          "history": "repetition 1.2 + frequency 0.5 (greedy)"}
# The setting timed against transformers' sampling with the same processors.
PEER_SETTING = "all"
# llama.cpp's samplers, each at temperature 1.0 (the samplers study).
SAMPLERS: dict[str, dict] = {
    "xtc": dict(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1),
    "dry": dict(temperature=1.0, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
                dry_penalty_last_n=-1, dry_sequence_breakers=[0, 1, 2, 3]),
    "mirostat": dict(temperature=1.0, mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1),
    "dynatemp": dict(temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=1.0),
}
# Contrastive search's degeneration penalty and candidates per step.
CONTRASTIVE = dict(penalty_alpha=0.6, top_k=4)
LABELS.update({"xtc": "XTC 0.5 / 0.1", "dry": "DRY 0.8", "mirostat": "Mirostat v2 tau 5",
               "dynatemp": "dynamic temperature 1 +- 0.5",
               "contrastive": f"contrastive search k {CONTRASTIVE['top_k']}"})


def time_settings(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  max_len: int, *, peer: bool) -> dict:
    """Greedy's timings (unprefixed, ``timing.time_generate``'s keys) and each setting's under
    ``<setting>_``; with ``peer``, transformers' on ``PEER_SETTING`` under ``hf_<setting>_``
    (absent without the extra). Every call generates ``new_tokens`` per row (``time_programs``).
    """
    B, P = prompts.shape
    programs = {"": SamplingParams(temperature=0.0),
                **{name: SamplingParams(**fields) for name, fields in SETTINGS.items()}}
    found = time_programs(model, prompts, programs, new_tokens, repeats,
                          DecodeOptions(max_len=max_len or P + new_tokens))
    if peer:
        hf = peers.time_hf_generate(model, prompts, new_tokens, repeats,
                                    SamplingParams(**SETTINGS[PEER_SETTING]))
        found.update({f"hf_{PEER_SETTING}_{key[3:]}": value for key, value in hf.items()})
    return found


def time_programs(model: Transformer, prompts: np.ndarray, programs: dict[str, SamplingParams],
                  new_tokens: int, repeats: int, options: DecodeOptions) -> dict:
    """``timing.time_generate``'s keys for each named ``SamplingParams`` of ``programs`` under
    ``<name>_`` (the name ``""``: unprefixed), the same rows (``prompts [B, P]``) and ``options``;
    every call must generate ``new_tokens`` per row. The repetitions are interleaved
    (``timing.time_interleaved``); parameters are data, so the first call compiles for all."""
    runs = {name: functools.partial(generate, model, prompts.tolist(), params, seed=0,
                                    options=options)
            for name, params in programs.items()}
    return timing.time_interleaved(runs, prompts.shape[0], new_tokens, repeats)


def time_samplers(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  max_len: int) -> dict:
    """Greedy's timings (unprefixed) and each of ``SAMPLERS``' under ``<name>_``, and contrastive
    search's (``CONTRASTIVE``) under ``contrastive_``: the same rows, their repetitions
    interleaved (``timing.time_interleaved``)."""
    options = DecodeOptions(max_len=max_len or prompts.shape[1] + new_tokens)
    rows = prompts.tolist()
    runs = {name: functools.partial(generate, model, rows, SamplingParams(**fields), seed=0,
                                    options=options)
            for name, fields in {"": dict(temperature=0.0), **SAMPLERS}.items()}
    runs["contrastive"] = lambda n: contrastive_search(
        model, rows, CONTRASTIVE["penalty_alpha"], CONTRASTIVE["top_k"], n, options=options)
    found = timing.time_interleaved(runs, prompts.shape[0], new_tokens, repeats)
    return {**found, "contrastive_top_k": CONTRASTIVE["top_k"]}
