"""Request traces: Poisson arrivals with prompt and output lengths drawn from small distributions,
seeded, saved to and replayed from JSONL so every policy sees the identical requests.

A trace is a list of ``Request`` sorted by ``arrival`` (seconds after the trace starts). The output
length of a request is its budget ``max_new_tokens``: a serving trace says how long each answer is,
and the engine stops the request there (the study uses no EOS, so every request runs its budget).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from decodelab.sampling.params import SamplingParams
from decodelab.serving.requests import Request


def _check_positive(name: str, value: Any, *, integer: bool = False) -> None:
    ok_type = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not value > 0 or not math.isfinite(value):
        kind = "an int" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind} > 0, got {value!r}")


class LengthDistribution(abc.ABC):
    """Token counts >= 1 drawn from a seeded generator."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:  # [n] int64, each >= 1
        ...

    @abc.abstractmethod
    def maximum(self) -> int:
        """The largest length it can draw."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class Fixed(LengthDistribution):
    kind: ClassVar[str] = "fixed"
    length: int

    def __post_init__(self):
        _check_positive("length", self.length, integer=True)

    def sample(self, rng, n):
        return np.full((n,), self.length, np.int64)

    def maximum(self):
        return self.length


@dataclasses.dataclass(frozen=True)
class Uniform(LengthDistribution):
    """Uniform on the integers ``low .. high`` (both included)."""

    kind: ClassVar[str] = "uniform"
    low: int
    high: int

    def __post_init__(self):
        _check_positive("low", self.low, integer=True)
        if not isinstance(self.high, (int, np.integer)) or self.high < self.low:
            raise ValueError(f"high must be an int >= low={self.low}, got {self.high!r}")

    def sample(self, rng, n):
        return rng.integers(self.low, self.high + 1, size=n)

    def maximum(self):
        return self.high


@dataclasses.dataclass(frozen=True)
class Exponential(LengthDistribution):
    """``1 + floor(Exp(mean - 1))``, capped at ``cap``: a long tail of few long answers."""

    kind: ClassVar[str] = "exponential"
    mean: float
    cap: int

    def __post_init__(self):
        _check_positive("mean", self.mean)
        _check_positive("cap", self.cap, integer=True)

    def sample(self, rng, n):
        draws = 1 + np.floor(rng.exponential(max(self.mean - 1, 1e-9), size=n)).astype(np.int64)
        return np.minimum(draws, self.cap)

    def maximum(self):
        return self.cap


@dataclasses.dataclass(frozen=True)
class LogNormal(LengthDistribution):
    """``round(median * exp(sigma * N(0, 1)))``, clipped to ``1 .. cap``."""

    kind: ClassVar[str] = "lognormal"
    median: float
    sigma: float
    cap: int

    def __post_init__(self):
        _check_positive("median", self.median)
        _check_positive("sigma", self.sigma)
        _check_positive("cap", self.cap, integer=True)

    def sample(self, rng, n):
        draws = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n))).astype(np.int64)
        return np.clip(draws, 1, self.cap)

    def maximum(self):
        return self.cap


LENGTHS: dict[str, type[LengthDistribution]] = {
    cls.kind: cls for cls in (Fixed, Uniform, Exponential, LogNormal)}


def length_distribution(spec: LengthDistribution | Mapping[str, Any]) -> LengthDistribution:
    """A distribution from ``{"kind": "lognormal", "median": 32, "sigma": 1.0, "cap": 192}``."""
    if isinstance(spec, LengthDistribution):
        return spec
    if not isinstance(spec, Mapping) or spec.get("kind") not in LENGTHS:
        raise ValueError(f"a length distribution must be a dict with kind in {sorted(LENGTHS)}, "
                         f"got {spec!r}")
    fields = {k: v for k, v in spec.items() if k != "kind"}
    try:
        return LENGTHS[spec["kind"]](**fields)
    except TypeError as error:
        raise ValueError(f"bad fields for length distribution {spec!r}: {error}") from None


def poisson_trace(num_requests: int, rate: float, prompt_lengths, output_lengths, *,
                  vocab_size: int, seed: int = 0, params: SamplingParams | None = None,
                  seed_offset: int = 0) -> list[Request]:
    """``num_requests`` requests arriving as a Poisson process of ``rate`` requests per second
    (exponential gaps, the first at time 0), with random prompt tokens in ``[0, vocab_size)``.

    Request i gets id i and sampling seed ``seed_offset + i``; everything is drawn from
    ``numpy.random.default_rng(seed)``, so the same arguments give the same trace.
    """
    _check_positive("num_requests", num_requests, integer=True)
    _check_positive("rate", rate)
    _check_positive("vocab_size", vocab_size, integer=True)
    prompt_lengths = length_distribution(prompt_lengths)
    output_lengths = length_distribution(output_lengths)
    params = params or SamplingParams.greedy()
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=num_requests)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    prompts = prompt_lengths.sample(rng, num_requests)
    outputs = output_lengths.sample(rng, num_requests)
    return [Request(id=i, prompt=rng.integers(0, vocab_size, size=int(prompts[i])).tolist(),
                    max_new_tokens=int(outputs[i]), params=params, seed=seed_offset + i,
                    arrival=float(arrivals[i]))
            for i in range(num_requests)]


# --- JSONL ---------------------------------------------------------------------------------------

_PARAM_FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]


def _request_to_dict(request: Request) -> dict:
    defaults = SamplingParams()
    params = {name: getattr(request.params, name) for name in _PARAM_FIELDS
              if getattr(request.params, name) != getattr(defaults, name)}
    return {"id": request.id, "arrival": request.arrival, "prompt": list(request.prompt),
            "max_new_tokens": request.max_new_tokens, "seed": request.seed, "params": params,
            "stop_sequences": [list(s) for s in request.stop_sequences]} | (
                {"n": request.n} if request.n > 1 else {})


def _request_from_dict(record: Any) -> Request:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    required = {"id", "arrival", "prompt", "max_new_tokens"}
    allowed = required | {"seed", "params", "stop_sequences", "n"}
    if missing := sorted(required - set(record)):
        raise ValueError(f"missing fields {missing}")
    if unknown := sorted(set(record) - allowed):
        raise ValueError(f"unknown fields {unknown}; allowed: {sorted(allowed)}")
    params = record.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"params must be an object of SamplingParams fields, got {params!r}")
    try:
        sampling = SamplingParams(**params)
    except TypeError as error:
        raise ValueError(f"params: {error}") from None
    return Request(id=record["id"], prompt=record["prompt"],
                   max_new_tokens=record["max_new_tokens"], params=sampling,
                   seed=record.get("seed", 0), stop_sequences=record.get("stop_sequences", ()),
                   arrival=record["arrival"], n=record.get("n", 1))


def save_trace(trace: Sequence[Request], path: str | os.PathLike) -> pathlib.Path:
    """One JSON object per request, in arrival order."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keys in their own order: a JSON schema's property order is the order of its output.
    lines = [json.dumps(_request_to_dict(r)) for r in trace]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def load_trace(path: str | os.PathLike) -> list[Request]:
    """The requests of a JSONL trace; a line that is not a valid request is a ValueError naming
    the file and line number. Blank lines are skipped; ids must be unique."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing trace file, got {str(path)!r}")
    trace, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = _request_from_dict(json.loads(line))
            if request.id in seen:
                raise ValueError(f"duplicate request id {request.id!r}")
        except (ValueError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}:{number}: not a valid request: {error}") from None
        seen.add(request.id)
        trace.append(request)
    return sorted(trace, key=lambda r: r.arrival)
