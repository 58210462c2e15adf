"""Experiments: config files with their sweeps, a resumable sharded runner, and result rows.

An experiment is a config file and a point function::

    configs/<name>.py      get_config(arg) -> ConfigDict with `experiment` (its name) and `seed`
                           get_sweep(arg)  -> list of override dicts (optional; none = one point)
    experiments/<name>.py  point_fn(config, ctx) -> {metric name: float | int | str | bool | None}

The runner applies each override dict (dotted keys, ``{"model.position": "alibi"}``) to the base
config (command-line overrides already in it), runs the points of its shard that have no row yet and
appends one row per finished point to ``<workdir>/rows.jsonl``. For example::

    # configs/lengths.py
    def get_config(arg=None):
        return ConfigDict(dict(experiment="lengths", seed=0, tokenizer=..., train=...,
                               model=presets.model_section(arg or "small"), eval=dict(length=128)))

    def get_sweep(arg=None):
        return product({"model.position": ["rope", "alibi"], "eval.length": [128, 256, 512]})

    # experiments/lengths.py
    _FLAGS = experiment.define_flags("configs/lengths.py")

    def evaluate(config, ctx):  # one point; the model is trained once and cached in the workdir
        model, tok = pipeline.trained_model(config.tokenizer, config.model, config.train,
                                            ctx.workdir, progress=ctx.show_progress)
        return metrics.perplexity(model, data.token_stream(tok, "validation"), config.eval.length)

    def main(argv):
        experiment.run_from_flags(_FLAGS, evaluate)

What a caller may rely on:

- A point is identified by its config hash: the first 16 hex digits of the sha256 of the resolved
  config as canonical JSON (sorted keys). The same resolved config always gets the same hash, however
  it was reached; two points of one sweep with the same hash are an error. Every field counts, even
  one that cannot change a result (an evaluation batch size): changing it makes new points.
- Shard ``i/n`` runs the points whose sweep index is ``i`` modulo ``n``: the shards of one sweep
  partition it (all shards must run the same config file, argument and overrides).
- ``rows.jsonl`` holds one JSON object per line and at most one row per config hash. Every write
  replaces the whole file (a temporary file in the same folder, fsync, ``os.replace``) while holding
  an ``flock`` on ``rows.jsonl.lock``: a reader sees the file before or after a row, never part of
  one, and processes sharing a workdir on one machine never lose each other's rows (shards on
  several machines write to their own workdirs and merge with ``merge_rows`` / ``add_rows``).
  Reading rejects a line that is not a row instead of skipping it.
- Re-running skips every point that has a row, so an interrupted sweep (Ctrl-C, a killed process)
  loses only the points in progress.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import datetime
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import numbers
import os
import pathlib
import platform
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from absl import flags, logging
from ml_collections import config_dict, config_flags
from tqdm.auto import tqdm

ROWS_FILE = "rows.jsonl"
LOCK_FILE = "rows.jsonl.lock"
_TEMP_PREFIX = ".rows.jsonl."
_TEMP_SUFFIX = ".tmp"
# Keys every row has; `provenance` holds PROVENANCE_FIELDS.
ROW_FIELDS = ("experiment", "config_hash", "seed", "sweep_index", "overrides", "config", "metrics",
              "start_time", "wall_time_s", "provenance")
PROVENANCE_FIELDS = ("git_commit", "git_dirty", "python_version", "jax_version", "jaxlib_version",
                     "flax_version", "backend", "device_kind", "device_count", "cpu_count",
                     "command")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHARD = re.compile(r"(\d+)/(\d+)")

Metrics = dict[str, float | int | str | bool | None]


# --------------------------------------------------------------------------- sweeps as data

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


# --------------------------------------------------------------------------- configs and points

def check_base_config(config: config_dict.ConfigDict) -> None:
    """A base config needs ``experiment`` (a Python identifier: it names the module and the default
    workdir) and an int ``seed``."""
    if not isinstance(config, config_dict.ConfigDict):
        raise ValueError(f"config must be an ml_collections ConfigDict, got "
                         f"{type(config).__name__}")
    name = config.get("experiment")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"config.experiment must be a name like 'extrapolation' (letters, digits, "
                         f"underscores), got {name!r}")
    seed = config.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"config.seed must be an int, got {seed!r}")


def config_hash(config: config_dict.ConfigDict | Mapping[str, Any]) -> str:
    """First 16 hex digits of the sha256 of ``config`` as canonical JSON (sorted keys, no spaces)."""
    resolved = config.to_dict() if isinstance(config, config_dict.ConfigDict) else dict(config)
    try:
        text = json.dumps(resolved, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config must hold only JSON values (str, int, finite float, bool, None, "
                         f"lists, sections), got: {e}") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def apply_overrides(config: config_dict.ConfigDict, overrides: Mapping[str, Any]
                    ) -> config_dict.ConfigDict:
    """A copy of ``config`` with each dotted key set; the original is unchanged.

    Raises ValueError naming the key if it does not exist, names a section, or gets a value of
    the wrong type (the config's types are kept: an int may fill a float field, nothing else).
    """
    result = copy.deepcopy(config)  # keeps field types and the lock
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"override keys must be dotted config keys, got {key!r}")
        if key == "experiment":
            raise ValueError("a sweep point must not override 'experiment': every point of a run "
                             "belongs to one experiment")
        node, parts = result, key.split(".")
        for depth, part in enumerate(parts):
            where = ".".join(parts[:depth]) or "the config"
            if not isinstance(node, config_dict.ConfigDict):
                raise ValueError(f"override key {key!r} does not exist in the config: {where} is "
                                 f"a value, not a section")
            if part not in node:
                raise ValueError(f"override key {key!r} does not exist in the config: {where} has "
                                 f"no field {part!r} (its fields: {sorted(node.keys())})")
            if depth < len(parts) - 1:
                node = node[part]
        if isinstance(node[parts[-1]], config_dict.ConfigDict):
            raise ValueError(f"override key {key!r} names a section; override its fields "
                             f"({key}.<field>) instead")
        try:
            node[parts[-1]] = value
        except TypeError as e:
            raise ValueError(f"override {key}={value!r} has the wrong type: {e}") from None
    return result


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


# --------------------------------------------------------------------------- provenance

def git_state(directory: str | os.PathLike) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``directory``; ``("unknown", None)`` outside
    one. Dirty means tracked files differ from the commit (untracked files do not count, as in
    ``git describe --dirty``)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, dirty


def current_command() -> str:
    """The command line of this process as one would type it (``python -m pkg.mod args``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = (["python", "-m", spec.name] if spec is not None and spec.name != "__main__"
               else ["python", sys.argv[0]])
    return shlex.join(program + sys.argv[1:])


@functools.cache
def _static_provenance() -> tuple[tuple[str, Any], ...]:
    import jax  # deferred: reading rows and rendering tables need no accelerator runtime

    commit, dirty = git_state(pathlib.Path(__file__).resolve().parent)
    devices = jax.devices()
    fields = {
        "git_commit": commit,
        "git_dirty": dirty,
        "python_version": platform.python_version(),
        "jax_version": importlib.metadata.version("jax"),
        "jaxlib_version": importlib.metadata.version("jaxlib"),
        "flax_version": importlib.metadata.version("flax"),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "cpu_count": os.cpu_count(),
    }
    return tuple(fields.items())


def provenance(command: str | None = None) -> dict[str, Any]:
    """PROVENANCE_FIELDS of this process: git state of the decodelab checkout, versions, machine,
    and the command (this process's unless given). Computed once per process."""
    command = current_command() if command is None else command
    return {**dict(_static_provenance()), "command": command}


# --------------------------------------------------------------------------- the rows file

def _as_workdir(workdir: str | os.PathLike) -> pathlib.Path:
    workdir = pathlib.Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir must be a directory, got a file: {str(workdir)!r}")
    return workdir


def read_rows(workdir: str | os.PathLike) -> list[dict]:
    """The rows of ``<workdir>/rows.jsonl`` in file order (``[]`` if there is none yet).

    Raises ValueError for a line that is not a complete row, or two rows with one config hash.
    """
    path = _as_workdir(workdir) / ROWS_FILE
    if not path.exists():
        return []
    rows, seen = [], {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number} is not a JSON row ({e}); the runner never writes "
                             "such a line, so the file was edited or written by something else")
        missing = [f for f in ROW_FIELDS if f not in row] if isinstance(row, dict) else ROW_FIELDS
        if missing:
            raise ValueError(f"{path}:{number} is not a result row: it lacks {list(missing)}")
        if row["config_hash"] in seen:
            raise ValueError(f"{path}:{number} repeats config hash {row['config_hash']} of line "
                             f"{seen[row['config_hash']]}; merge row lists with merge_rows")
        seen[row["config_hash"]] = number
        rows.append(row)
    return rows


def merge_rows(*row_lists: Iterable[Mapping[str, Any]]) -> list[dict]:
    """One list of rows with each config hash once (the first row of a hash wins, e.g. when two
    shards ran the same point), in order of first appearance. All rows must be of one experiment."""
    merged: dict[str, dict] = {}
    for rows in row_lists:
        for row in rows:
            merged.setdefault(row["config_hash"], dict(row))
    names = sorted({row["experiment"] for row in merged.values()})
    if len(names) > 1:
        raise ValueError(f"rows must all be of one experiment to merge, got {names}")
    return list(merged.values())


@contextlib.contextmanager
def _locked(workdir: pathlib.Path):
    with open(workdir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _replace_rows(workdir: pathlib.Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``rows`` as the whole rows file, atomically; the caller holds the lock."""
    # Writers create temporary files only while holding the lock, so any found now is left over
    # from a writer that was killed.
    for stale in workdir.glob(_TEMP_PREFIX + "*" + _TEMP_SUFFIX):
        stale.unlink(missing_ok=True)
    fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=workdir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); give it the mode the lock file got from the umask.
        os.chmod(temp, stat.S_IMODE(os.stat(workdir / LOCK_FILE).st_mode))
        os.replace(temp, workdir / ROWS_FILE)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(workdir, os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def add_rows(workdir: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> int:
    """Add ``rows`` to ``<workdir>/rows.jsonl`` (created if needed) in one atomic write; rows whose
    config hash is already there are skipped. Returns how many were added.

    Merging shards' workdirs into one: ``add_rows(dest, merge_rows(read_rows(a), read_rows(b)))``.
    """
    workdir = _as_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    for row in rows:
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise ValueError(f"rows must have every field of ROW_FIELDS, got one without {missing}")
    with _locked(workdir):
        existing = read_rows(workdir)
        merged = merge_rows(existing, rows)
        if len(merged) > len(existing):
            _replace_rows(workdir, merged)
    return len(merged) - len(existing)


# --------------------------------------------------------------------------- the runner

@dataclasses.dataclass(frozen=True)
class PointContext:
    """What a point function gets besides its config."""

    # The experiment's workdir, shared by all points (e.g. for cached models, see pipeline.py).
    workdir: pathlib.Path
    point: Point
    # Whether progress bars are shown; pass it on (e.g. ``train(progress=ctx.show_progress)``).
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


def _check_metrics(metrics: Any, point: Point) -> Metrics:
    where = f"point {point.index} {point.overrides}"
    if not isinstance(metrics, Mapping):
        raise ValueError(f"point_fn must return a dict of metrics, got {type(metrics).__name__} "
                         f"for {where}")
    checked: Metrics = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r} for {where}")
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()  # NumPy / JAX scalars
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = int(value)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"metric {name!r} must be finite, got {value} for {where}; return "
                                 "None (not applicable) or a string instead")
        elif value is not None and not isinstance(value, (str, bool)):
            raise ValueError(f"metric {name!r} must be a number, str, bool or None, got "
                             f"{type(value).__name__} for {where}")
        checked[name] = value
    return checked


def _describe(point: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.overrides.items()) or "base config"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run(
    config: config_dict.ConfigDict,
    sweep: Sequence[Mapping[str, Any]],
    point_fn: Callable[[config_dict.ConfigDict, PointContext], Mapping[str, Any]],
    workdir: str | os.PathLike,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    progress: bool = True,
    command: str | None = None,
) -> list[dict]:
    """Run the points of shard ``shard_index/shard_count`` of ``sweep`` that have no row in
    ``workdir``, appending a row after each. Returns the rows of this shard's points, in sweep order.

    Everything is checked before the first point runs: the sweep (unknown keys, duplicates), the
    shard, the workdir (not a file) and its rows (all of ``config.experiment``).
    """
    points = expand(config, sweep)
    mine = shard(points, shard_index, shard_count)
    workdir = _as_workdir(workdir)
    existing = read_rows(workdir)
    others = sorted({row["experiment"] for row in existing} - {config.experiment})
    if others:
        raise ValueError(f"workdir {str(workdir)!r} holds rows of experiment {others}, not "
                         f"{config.experiment!r}; use another --workdir for this experiment")
    workdir.mkdir(parents=True, exist_ok=True)
    rows = {row["config_hash"]: row for row in existing}
    todo = [p for p in mine if p.config_hash not in rows]
    fields = provenance(command)

    label = config.experiment + (f" {shard_index}/{shard_count}" if shard_count > 1 else "")
    with tqdm(total=len(mine), initial=len(mine) - len(todo), desc=label, unit="point",
              disable=not progress, dynamic_ncols=True) as bar:
        for point in todo:
            bar.set_postfix_str(_describe(point))
            start_time, start = _utc_now(), time.perf_counter()
            metrics = point_fn(point.config, PointContext(workdir, point, progress, bar))
            row = {
                "experiment": config.experiment,
                "config_hash": point.config_hash,
                "seed": point.config.seed,
                "sweep_index": point.index,
                "overrides": point.overrides,
                "config": point.config.to_dict(),
                "metrics": _check_metrics(metrics, point),
                "start_time": start_time,
                "wall_time_s": time.perf_counter() - start,
                "provenance": fields,
            }
            add_rows(workdir, [row])
            rows.setdefault(point.config_hash, row)
            bar.update(1)
    return [rows[p.config_hash] for p in mine]


# --------------------------------------------------------------------------- absl entry points

@dataclasses.dataclass(frozen=True)
class ExperimentFlags:
    """The flags of an experiment program (see ``define_flags``)."""

    config: flags.FlagHolder
    workdir: flags.FlagHolder
    sweep_shard: flags.FlagHolder
    flag_values: flags.FlagValues


def define_flags(default_config: str | None = None) -> ExperimentFlags:
    """Define ``--config`` (a locked config file, so a misspelt override fails by name),
    ``--workdir`` (default ``runs/<experiment>``) and ``--sweep_shard`` (``i/n``, default ``0/1``).

    When the global flags are already parsed or these names are taken, the module is being imported
    by another program (e.g. ``experiments.report`` reading its ``report`` function): the flags then
    go to a private FlagValues, so the import neither clashes with nor changes the program's flags.
    """
    names = ("config", "workdir", "sweep_shard")
    shared = flags.FLAGS
    flag_values = (flags.FlagValues() if shared.is_parsed() or any(n in shared for n in names)
                   else shared)
    return ExperimentFlags(
        config=config_flags.DEFINE_config_file(
            "config", default_config, "Config file, `path.py` or `path.py:arg`; override fields "
            "with --config.<key>=<value>.", lock_config=True, flag_values=flag_values),
        workdir=flags.DEFINE_string(
            "workdir", None, "Folder for rows.jsonl and cached models; default runs/<experiment>.",
            flag_values=flag_values),
        sweep_shard=flags.DEFINE_string(
            "sweep_shard", "0/1", "Run shard i of n of the sweep (points whose index % n == i).",
            flag_values=flag_values),
        flag_values=flag_values,
    )


def run_from_flags(experiment_flags: ExperimentFlags,
                   point_fn: Callable[[config_dict.ConfigDict, PointContext], Mapping[str, Any]]
                   ) -> list[dict]:
    """Run the sweep of the parsed flags (see ``run``); print where the rows are and how to render
    them. Ctrl-C stops after saying what was kept."""
    if not experiment_flags.flag_values.is_parsed():
        raise ValueError("run_from_flags needs parsed flags: call it from main under absl.app.run, "
                         "in the program that called define_flags")
    if experiment_flags.config.value is None:
        raise ValueError("--config is required, e.g. --config=configs/<name>.py")
    filename = config_flags.get_config_filename(experiment_flags.flag_values["config"])
    path, _, arg = filename.partition(":")
    if not pathlib.Path(path).is_file():
        raise ValueError(f"--config file must exist, got {path!r}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # JAX and Orbax log routine steps at INFO
    config = experiment_flags.config.value
    check_base_config(config)
    sweep = load_sweep(path, arg or None)
    shard_index, shard_count = parse_shard(experiment_flags.sweep_shard.value)
    workdir = pathlib.Path(experiment_flags.workdir.value or f"runs/{config.experiment}")
    try:
        rows = run(config, sweep, point_fn, workdir, shard_index=shard_index,
                   shard_count=shard_count)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished point is in {workdir / ROWS_FILE}; run the same "
              "command again to continue", file=sys.stderr)
        sys.exit(130)
    print(f"{len(rows)} points of shard {shard_index}/{shard_count} in {workdir / ROWS_FILE}; "
          f"tables and plots: python -m experiments.report --workdir={workdir}")
    return rows


@contextlib.contextmanager
def count_traces():
    """Count jit traces (each one is a compilation) by function name while the block runs:
    ``with count_traces() as counts: ...`` then ``counts["_decode_loop"]``. Through
    ``jax.monitoring``, so it sees every jitted function, ours or a library's."""
    import jax

    counts: collections.Counter = collections.Counter()

    def listen(event, duration, **kwargs):
        del duration
        if event == "/jax/core/compile/jaxpr_trace_duration":
            counts[kwargs.get("fun_name")] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
