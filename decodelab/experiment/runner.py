"""The runner: runs the points of a sweep that have no row yet, appending a row after each.

Re-running skips every point that has a row, so an interrupted sweep (Ctrl-C, a killed process)
loses only the points in progress.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import numbers
import os
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
from ml_collections import config_dict
from tqdm.auto import tqdm

from decodelab.experiment.provenance import cpu_seconds, provenance
from decodelab.experiment.sweep import Point, expand, shard
from decodelab.measure.compiles import release_near_map_limit
from decodelab.measure.timing import SHARED_CORES
from decodelab.report.pages import other_cores
from decodelab.report.rows import (add_rows, as_workdir, check_writable, config_differences,
                                   json_dumps, read_rows)

Metrics = dict[str, float | int | str | bool | None | list | dict[str, list]]


@dataclasses.dataclass(frozen=True)
class PointContext:
    """What a point function gets besides its config."""

    # The experiment's workdir, shared by all points (e.g. for cached models, see experiment/artefacts.py).
    workdir: pathlib.Path
    point: Point
    # Whether progress bars are shown; pass it on (e.g.
    # ``artefacts.load_or_train(progress=ctx.show_progress)``).
    show_progress: bool
    _bar: Any = dataclasses.field(default=None, repr=False)

    def status(self, text: str) -> None:
        """Show ``text`` after the point's overrides on the sweep's progress bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"{_describe(self.point)}: {text}")

    def progress(self, iterable: Iterable | None = None, **kwargs) -> tqdm:
        """A progress bar for work inside the point (tqdm arguments), removed when it closes."""
        kwargs.setdefault("leave", False)
        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, disable=not self.show_progress, **kwargs)


def _scalar(name: str, value: Any, where: str) -> float | int | str | bool | None:
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # NumPy / JAX scalars
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r} must be finite, got {value} for {where}; return "
                             "None (not applicable) or a string instead")
        return value
    if value is not None and not isinstance(value, (str, bool)):
        raise ValueError(f"metric {name!r} must be a number, str, bool or None (or per-unit "
                         f"numbers: a list, or a dict of lists), got {type(value).__name__} for "
                         f"{where}")
    return value


def _per_unit(name: str, values: Any, where: str) -> list[float | int | None]:
    """A list (or 1-D array) of finite numbers, one per evaluation unit; None where the quantity
    is not defined for a unit (e.g. a request's time per output token below two tokens)."""
    if hasattr(values, "tolist") and getattr(values, "ndim", None) == 1:
        values = values.tolist()
    checked = [_scalar(name, v, where) for v in values]
    if any(isinstance(v, (str, bool)) for v in checked):
        raise ValueError(f"metric {name!r} holds per-unit values, which must all be numbers or "
                         f"None, got {values!r} for {where}")
    return checked


def _check_metrics(metrics: Any, point: Point) -> Metrics:
    """Plain JSON values: a number, str, bool or None; or per-unit values kept for resampling
    (``decodelab.measure.stats``): a list of numbers, or a dict of such lists (one per column)."""
    where = f"point {point.index} {point.overrides}"
    if not isinstance(metrics, Mapping):
        raise ValueError(f"point_fn must return a dict of metrics, got {type(metrics).__name__} "
                         f"for {where}")
    checked: Metrics = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r} for {where}")
        if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) == 1:
            checked[name] = _per_unit(name, value, where)
        elif isinstance(value, Mapping):
            checked[name] = {str(column): _per_unit(f"{name}.{column}", values, where)
                             for column, values in value.items()}
        else:
            checked[name] = _scalar(name, value, where)
    return checked


def _describe(point: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.overrides.items()) or "base config"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How ``run`` treats a sweep: which shard runs, the sweep's name, and whether it may extend
    the workdir's sweep of that name."""

    # Shard ``shard_index`` of ``shard_count``: the points whose sweep index % count == index.
    shard_index: int = 0
    shard_count: int = 1
    # The sweep's name, written in each row (``sweep``): the config file and argument that declare
    # it (``bench_decode.py:sampling``; ``run_from_flags`` sets it). One workdir may hold several
    # sweeps; rows of one name are one sweep.
    name: str | None = None
    # Add this run's points to a workdir whose sweep of the same name ran with other settings
    # (``--extend_sweep``); without it such a run is refused before any point runs.
    extend: bool = False
    # Run again the points whose row says the machine was shared while they ran (``shared``:
    # other processes kept ``measure.timing.SHARED_CORES`` cores or more busy on average), and
    # put the new row in the old one's place (``--rerun_shared``).
    rerun_shared: bool = False


def _key(overrides: Mapping[str, Any]) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def _describe_changes(stale: list[dict], by_overrides: Mapping[str, Point]) -> str:
    changes: dict[str, set] = {}
    for row in stale:
        point = by_overrides[_key(row["overrides"])]
        for key, (old, new) in config_differences(row["config"], point.config.to_dict()).items():
            changes.setdefault(key, set()).add((json_dumps(old), json_dumps(new)))
    return "; ".join(f"{key} was {' / '.join(sorted(o for o, _ in pairs))}, now "
                     f"{' / '.join(sorted({n for _, n in pairs}))}"
                     for key, pairs in list(changes.items())[:6])


def shared(row: Mapping[str, Any]) -> float | None:
    """The cores other processes kept busy on average during ``row``'s point
    (``report.other_cores``) where that reaches ``SHARED_CORES``: its timings are not of a quiet
    machine. None for a quiet point, or one that recorded no reading."""
    busy = other_cores([row])
    return busy[0] if busy and busy[0] >= SHARED_CORES else None


def _warn_shared(rows: Sequence[Mapping[str, Any]], options: SweepOptions) -> None:
    busy = [(row["sweep_index"], cores) for row in rows if (cores := shared(row)) is not None]
    if not busy:
        return
    named = "; ".join(f"point {index} ({cores:.2f} cores)" for index, cores in busy[:5])
    more = f" and {len(busy) - 5} more" if len(busy) > 5 else ""
    again = ("" if options.rerun_shared else "; run the same command with --rerun_shared once the "
             "machine is quiet to measure them again")
    warnings.warn(f"{len(busy)} of {len(rows)} points ran while other processes kept "
                  f"{SHARED_CORES} cores or more busy, so their timings are not of a quiet machine: "
                  f"{named}{more}{again}", stacklevel=3)


def check_one_sweep(existing: Sequence[Mapping[str, Any]], points: Sequence[Point],
                    options: SweepOptions, workdir: pathlib.Path) -> None:
    """Refuse to run ``points`` beside rows of the same sweep (same name, same overrides) that
    ran with other settings, unless ``options.extend``: a page would find two rows for one point
    and could not tell which to show. Names the fields that differ and the two ways out."""
    hashes = {p.config_hash for p in points}
    by_overrides = {_key(p.overrides): p for p in points}
    stale = [row for row in existing if row.get("sweep") == options.name
             and row["config_hash"] not in hashes and _key(row["overrides"]) in by_overrides]
    if stale and not options.extend:
        name = f"sweep {options.name!r}" if options.name else "this sweep"
        raise ValueError(
            f"workdir {str(workdir)!r} holds {len(stale)} rows of {name} run with other settings "
            f"({_describe_changes(stale, by_overrides)}); its points would get a second row each. "
            "Use a new --workdir for these settings, or pass --extend_sweep to add them to the "
            "workdir's sweep (then pick rows with experiments.report --where=<field>=<value>)")


def run(
    config: config_dict.ConfigDict,
    sweep: Sequence[Mapping[str, Any]],
    point_fn: Callable[[config_dict.ConfigDict, PointContext], Mapping[str, Any]],
    workdir: str | os.PathLike,
    *,
    options: SweepOptions | None = None,
    progress: bool = True,
    command: str | None = None,
) -> list[dict]:
    """Run the points of shard ``options.shard_index/shard_count`` of ``sweep`` that have no row in
    ``workdir``, appending a row after each. Returns the rows of this shard's points, in sweep order.

    A point whose row says the machine was shared (``shared``) is named in a warning at the end,
    and with ``options.rerun_shared`` runs again on the next run.

    Everything is checked before the first point runs: the sweep (unknown keys, duplicates), the
    shard, the workdir (a folder this process can write: its lock file is created and a rows file
    written on trial) and its rows (all of ``config.experiment``, and none of this sweep run with
    other settings unless ``options.extend``: ``check_one_sweep``).
    """
    options = SweepOptions() if options is None else options
    shard_index, shard_count = options.shard_index, options.shard_count
    points = expand(config, sweep)
    mine = shard(points, shard_index, shard_count)
    workdir = as_workdir(workdir)
    existing = read_rows(workdir)
    others = sorted({row["experiment"] for row in existing} - {config.experiment})
    if others:
        raise ValueError(f"workdir {str(workdir)!r} holds rows of experiment {others}, not "
                         f"{config.experiment!r}; use another --workdir for this experiment")
    check_one_sweep(existing, points, options, workdir)
    check_writable(workdir)
    rows = {row["config_hash"]: row for row in existing}
    todo = [p for p in mine if p.config_hash not in rows
            or (options.rerun_shared and shared(rows[p.config_hash]) is not None)]
    fields = provenance(command)

    label = config.experiment + (f" {shard_index}/{shard_count}" if shard_count > 1 else "")
    with tqdm(total=len(mine), initial=len(mine) - len(todo), desc=label, unit="point",
              disable=not progress, dynamic_ncols=True) as bar:
        for point in todo:
            bar.set_postfix_str(_describe(point))
            start_time, start, cpu_start = _utc_now(), time.perf_counter(), cpu_seconds()
            metrics = point_fn(point.config, PointContext(workdir, point, progress, bar))
            wall, cpu_end = time.perf_counter() - start, cpu_seconds()
            row = {
                "experiment": config.experiment,
                "config_hash": point.config_hash,
                "seed": point.config.seed,
                "sweep": options.name,
                "sweep_index": point.index,
                "overrides": point.overrides,
                "config": point.config.to_dict(),
                "metrics": _check_metrics(metrics, point),
                "start_time": start_time,
                "wall_time_s": wall,
                "provenance": fields,
            }
            if cpu_start is not None and cpu_end is not None:
                # CPU seconds other processes took during the point (see cpu_seconds).
                row["other_cpu_s"] = max(0.0, (cpu_end[0] - cpu_start[0])
                                         - (cpu_end[1] - cpu_start[1]))
            if jax.process_index() == 0:  # one row per point of a multi-process run
                add_rows(workdir, [row], replace=point.config_hash in rows)
            rows[point.config_hash] = row
            bar.update(1)
            release_near_map_limit()  # a long sweep would otherwise crash compiling (see there)
    mine_rows = [rows[p.config_hash] for p in mine]
    _warn_shared(mine_rows, options)
    return mine_rows
