"""The rows file: ``<workdir>/rows.jsonl``, one JSON object per line, at most one row per config
hash.

Every write replaces the whole file (a temporary file in the same folder, fsync, ``os.replace``)
while holding an ``flock`` on ``rows.jsonl.lock``: a reader sees the file before or after a row,
never part of one, and processes sharing a workdir on one machine never lose each other's rows
(shards on several machines write to their own workdirs and merge with ``merge_rows`` /
``add_rows``). Reading rejects a line that is not a row instead of skipping it, except a torn
last line (a write cut short), which is skipped with a warning so its point runs again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import pathlib
import stat
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from decodelab.checks import as_path

ROWS_FILE = "rows.jsonl"
LOCK_FILE = "rows.jsonl.lock"
_TEMP_PREFIX = ".rows.jsonl."
_TEMP_SUFFIX = ".tmp"
# Keys every row has; `provenance` holds provenance.PROVENANCE_FIELDS.
ROW_FIELDS = ("experiment", "config_hash", "seed", "sweep_index", "overrides", "config", "metrics",
              "start_time", "wall_time_s", "provenance")


def as_workdir(workdir: str | os.PathLike) -> pathlib.Path:
    workdir = as_path("workdir", workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir must be a directory, got a file: {str(workdir)!r}")
    return workdir


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def json_dumps(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON that every standard parser reads: a NaN or infinite float becomes
    ``null`` (Python's ``json`` would write the bare ``NaN`` / ``Infinity`` that JSON lacks)."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def read_rows(workdir: str | os.PathLike) -> list[dict]:
    """The rows of ``<workdir>/rows.jsonl`` in file order (``[]`` if there is none yet).

    A last line without its newline is a write cut short (a crash, a full disk, a copy of a file
    being written): it is skipped with a warning naming it, so its point runs again and the next
    write drops it. Raises ValueError for any other line that is not a complete row, or two rows
    with one config hash. Every reader of a rows file (the runner, ``add_rows``, reports, the
    results index) reads it here.
    """
    path = as_workdir(workdir) / ROWS_FILE
    if not path.exists():
        return []
    text = path.read_bytes()
    whole, _, torn = text.rpartition(b"\n") if b"\n" in text else (b"", b"", text)
    lines = whole.decode("utf-8").splitlines() if whole else []
    if torn:
        warnings.warn(f"{path}:{len(lines) + 1} is a torn last line (a write cut short, "
                      f"{len(torn)} bytes without their newline); skipped, so the point it held "
                      "runs again", stacklevel=2)
    rows, seen = [], {}
    for number, line in enumerate(lines, 1):
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


def config_leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every value in nested dicts and lists (``model.position``,
    ``stops[0]``): a config as the flat fields a person overrides."""
    if isinstance(tree, Mapping):
        return [leaf for k, v in tree.items() for leaf in config_leaves(v, f"{prefix}{k}.")]
    if isinstance(tree, (list, tuple)) and tree:
        return [leaf for i, v in enumerate(tree)
                for leaf in config_leaves(v, f"{prefix[:-1]}[{i}].")]
    return [(prefix[:-1], tree)]


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple]:
    """The dotted fields whose values differ between configs ``a`` and ``b`` (a field one of
    them lacks included, as None), each with its two values, in sorted order."""
    left, right = dict(config_leaves(a)), dict(config_leaves(b))
    return {key: (left.get(key), right.get(key)) for key in sorted(left.keys() | right.keys())
            if left.get(key) != right.get(key)}


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


def check_writable(workdir: str | os.PathLike) -> pathlib.Path:
    """Create ``workdir`` (if needed) and its lock file, and check that a rows file can be written
    there, before anything is computed; raises ValueError naming the path that cannot be written.
    Returns the workdir."""
    workdir = as_workdir(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with _locked(workdir):
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=workdir)
            os.close(fd)
            os.unlink(temp)
    except OSError as e:
        where = e.filename if e.filename is not None else workdir
        raise ValueError(f"workdir must be a folder this process can write, got {str(workdir)!r}: "
                         f"cannot write {str(where)!r} ({e.strerror}); pass another --workdir or "
                         "fix its permissions") from None
    return workdir


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


def _check_fields(rows: Sequence[Mapping[str, Any]]) -> None:
    for row in rows:
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise ValueError(f"rows must have every field of ROW_FIELDS, got one without {missing}")


def write_rows(workdir: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> pathlib.Path:
    """Make ``rows`` the whole of ``<workdir>/rows.jsonl`` (created if needed), in one atomic
    write; rows already there are dropped. Returns the file's path.

    For a copy of exactly the rows a page was rendered from (``experiments.report`` keeps one beside
    the page), which a later run resumes from once copied into its workdir.
    """
    workdir = as_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = merge_rows(rows)
    _check_fields(rows)
    with _locked(workdir):
        _replace_rows(workdir, rows)
    return workdir / ROWS_FILE


def add_rows(workdir: str | os.PathLike, rows: Iterable[Mapping[str, Any]], *,
             replace: bool = False) -> int:
    """Add ``rows`` to ``<workdir>/rows.jsonl`` (created if needed) in one atomic write; rows whose
    config hash is already there are skipped, or with ``replace`` take the old row's place (a
    point measured again). Returns how many rows were added or replaced.

    Merging shards' workdirs into one: ``add_rows(dest, merge_rows(read_rows(a), read_rows(b)))``.
    """
    workdir = as_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    _check_fields(rows)
    with _locked(workdir):
        existing = read_rows(workdir)
        if replace:
            new = {row["config_hash"]: dict(row) for row in rows}
            merged = merge_rows([new.pop(row["config_hash"], row) for row in existing],
                                new.values())
            changed = len({row["config_hash"] for row in rows})
        else:
            merged = merge_rows(existing, rows)
            changed = len(merged) - len(existing)
        if changed:
            _replace_rows(workdir, merged)
    return changed
