"""Sweeps as data: product / zipped / cross of override axes, their expansion into points over a
base config, shards of a sweep, and a config file's ``get_sweep``.

Shard ``i/n`` runs the points whose sweep index is ``i`` modulo ``n``: the shards of one sweep
partition it (all shards must run the same config file, argument and overrides). Two points of
one sweep with the same config hash are an error.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ml_collections import config_dict

from decodelab.experiment.overrides import apply_overrides, check_base_config, config_hash

_SHARD = re.compile(r"(\d+)/(\d+)")


def _axes(axes: Mapping[str, Sequence] | None, more: Mapping[str, Sequence]) -> dict[str, list]:
    merged = dict(axes or {})
    for key in more:
        if key in merged:
            raise ValueError(f"axis {key!r} is given twice")
    merged.update(more)
    if not merged:
        raise ValueError("axes must name at least one key, got none")
    for key, values in merged.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"axis names must be non-empty strings, got {key!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueError(f"axis {key!r} must be a list of values, got {values!r}")
        merged[key] = list(values)
        if not merged[key]:
            raise ValueError(f"axis {key!r} must have at least one value, got []")
    return merged


def product(axes: Mapping[str, Sequence] | None = None, /, **more: Sequence) -> list[dict]:
    """Every combination of the axes' values, the last axis varying fastest.

    ``product({"model.position": ["rope", "alibi"], "seed": [0, 1]})`` is 4 points. Dotted keys go in
    the mapping; plain keys may also be keyword arguments.
    """
    merged = _axes(axes, more)
    keys = list(merged)
    return [dict(zip(keys, values)) for values in itertools.product(*merged.values())]


def zipped(axes: Mapping[str, Sequence] | None = None, /, **more: Sequence) -> list[dict]:
    """The i-th values of all axes together: axes of equal length n give n points."""
    merged = _axes(axes, more)
    lengths = {key: len(values) for key, values in merged.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"zipped axes must have equal lengths, got {lengths}")
    keys = list(merged)
    return [dict(zip(keys, values)) for values in zip(*merged.values())]


def cross(*sweeps: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Every combination of one point from each sweep, merged (the sweeps must set disjoint keys).

    ``cross(product(...) + product(...), product({"eval.length": [128, 256]}))``.
    """
    if not sweeps:
        raise ValueError("cross needs at least one sweep, got none")
    points = []
    for combination in itertools.product(*sweeps):
        point: dict = {}
        for part in combination:
            shared = sorted(set(point) & set(part))
            if shared:
                raise ValueError(f"swept sets must set disjoint keys, got {shared} in two of them")
            point.update(part)
        points.append(point)
    return points


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, its overrides and the config they give."""

    index: int
    overrides: dict[str, Any]
    config: config_dict.FrozenConfigDict
    config_hash: str


def expand(config: config_dict.ConfigDict, sweep: Sequence[Mapping[str, Any]]) -> list[Point]:
    """The points of ``sweep`` over the base ``config``, in sweep order."""
    check_base_config(config)
    if isinstance(sweep, Mapping) or not isinstance(sweep, Sequence) or not sweep:
        raise ValueError(f"sweep must be a non-empty list of override dicts, got {sweep!r}")
    points, seen = [], {}
    for index, overrides in enumerate(sweep):
        if not isinstance(overrides, Mapping):
            raise ValueError(f"sweep point {index} must be a dict of overrides, got {overrides!r}")
        try:
            resolved = apply_overrides(config, overrides)
        except ValueError as e:
            raise ValueError(f"sweep point {index} {dict(overrides)}: {e}") from None
        digest = config_hash(resolved)
        if digest in seen:
            raise ValueError(f"sweep points {seen[digest]} and {index} give the same config "
                             f"({dict(sweep[seen[digest]])} and {dict(overrides)}); each point "
                             "must be a different config")
        seen[digest] = index
        points.append(Point(index, dict(overrides), config_dict.FrozenConfigDict(resolved), digest))
    return points


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``n >= 1`` and ``0 <= i < n``."""
    match = _SHARD.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"sweep_shard must look like i/n (e.g. 0/4), got {text!r}")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"sweep_shard i/n must have n >= 1 and i in 0..n-1, got {text!r}")
    return index, count


def shard(points: Sequence[Point], index: int, count: int) -> list[Point]:
    """The points of shard ``index`` of ``count``: sweep index ``% count == index``."""
    parse_shard(f"{index}/{count}")
    return [p for p in points if p.index % count == index]


def load_sweep(path: str | os.PathLike, arg: str | None = None) -> list[dict]:
    """``get_sweep(arg)`` of a config file (``get_sweep()`` without an arg); ``[{}]`` (one point, the
    base config) if the file defines none."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"config file must exist, got {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"_decodelab_sweep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    get_sweep = getattr(module, "get_sweep", None)
    if get_sweep is None:
        return [{}]
    sweep = get_sweep() if arg is None else get_sweep(arg)
    if isinstance(sweep, Mapping) or not isinstance(sweep, Sequence) or not sweep:
        raise ValueError(f"get_sweep in {str(path)!r} must return a non-empty list of override "
                         f"dicts, got {sweep!r}")
    return list(sweep)
