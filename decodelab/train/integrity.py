"""Damaged checkpoint steps: what is cheap to verify before Orbax reads a step, the error that
names the damaged step and file, and quiet failures.

A step of an Orbax checkpoint holds one folder per item (``params``, ``opt_state``, ``meta``).
An array item is an OCDBT database: a manifest, B+tree nodes, and data files (under ``d/``)
holding each array chunk at an (offset, length). Listing those references costs a few small
reads, so a missing or truncated data file is found, and named, before any array is read.
Damage inside a file (garbled bytes) shows only when its chunk is decompressed: TensorStore's
error then names the chunk's key, and the references give its file.

When an Orbax read fails midway, the reads still in flight finish after its event loop has
closed, and Python prints a traceback for each (``RuntimeError: Event loop is closed``, ``Task
exception was never retrieved``): dozens of them around the one error that matters.
``read_step_item`` filters exactly those messages (nothing else), from its first read on.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import sys
from collections.abc import Callable
from typing import TypeVar

import tensorstore as ts

T = TypeVar("T")

# TensorStore's error for a chunk it could not read or decode names the chunk and its database.
_CHUNK_ERROR = re.compile(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]+)"')


class DamagedCheckpoint(ValueError):
    """A step of a checkpoint cannot be read; the message names the checkpoint, the step, the
    damaged part and its file."""


def damaged(path: os.PathLike | str, step: int, part: str, file: os.PathLike | str,
            error: BaseException | str) -> DamagedCheckpoint:
    """The error for ``part`` (e.g. ``"parameters"``) of ``step``, stored in ``file``; ``error``
    (the innermost cause of an exception is the one that says what failed) gives the detail."""
    if isinstance(error, BaseException):
        while error.__cause__ is not None:  # Orbax wraps TensorStore's error
            error = error.__cause__
        text = str(error).strip()
        chunk = _CHUNK_ERROR.search(text)
        if chunk:  # the rest of TensorStore's message says what is wrong with the chunk's bytes
            text = f"array chunk {chunk.group(1)!r}{text[chunk.end():]}"
        detail = f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
    else:
        detail = error
    return DamagedCheckpoint(f"checkpoint {str(path)!r} step {step} is damaged: its {part} "
                             f"cannot be read from {str(file)!r} ({detail})")


def chunk_files(item: pathlib.Path) -> dict[str, tuple[pathlib.Path, int]]:
    """Each chunk key of the OCDBT database ``item`` -> (its data file, the end of its bytes in
    that file). Raises what TensorStore raises for an unreadable manifest or node."""
    kvstore = ts.KvStore.open({"driver": "file", "path": f"{item}/"}).result()
    versions = ts.ocdbt.dump(kvstore).result()["versions"]
    pending = [v["root"]["location"] for v in versions[-1:] if "location" in v["root"]]
    chunks = {}
    while pending:
        for entry in ts.ocdbt.dump(kvstore, pending.pop()).result().get("entries", []):
            if "indirect_value" in entry:  # value:<base>:<file>:<offset>:<length>
                _, base, name, offset, length = entry["indirect_value"].split(":")
                key = entry["key"].decode() if isinstance(entry["key"], bytes) else entry["key"]
                chunks[key] = (item / base / name, int(offset) + int(length))
            elif "location" in entry:  # an interior node's child
                pending.append(entry["location"])
    return chunks


def verify_item(item: pathlib.Path) -> tuple[pathlib.Path, str] | None:
    """The first damaged file of the array item ``item`` (a missing folder, an unreadable
    manifest, a missing or truncated data file) and what is wrong with it; None if the cheap
    checks pass (or ``item`` is not an OCDBT database, whose files are not checked here)."""
    if not item.is_dir():
        return item, "the folder is missing"
    manifest = item / "manifest.ocdbt"
    if not manifest.exists():
        return None
    try:
        chunks = chunk_files(item)
    except Exception as e:  # noqa: BLE001 (TensorStore raises ValueError and others alike)
        return manifest, f"{type(e).__name__}: {str(e).strip()[:300]}"
    ends: dict[pathlib.Path, int] = {}
    for file, end in chunks.values():
        ends[file] = max(end, ends.get(file, 0))
    for file, end in sorted(ends.items()):
        if not file.is_file():
            return file, "the array data file is missing"
        if file.stat().st_size < end:
            return file, (f"the array data file is truncated: {file.stat().st_size} bytes, its "
                          f"manifest places data up to byte {end}")
    return None


def failing_file(error: BaseException, items: list[pathlib.Path]) -> pathlib.Path:
    """The file an Orbax read error comes from: the data file of the chunk TensorStore names, a
    file an OSError names, or else the first item folder."""
    while error.__cause__ is not None:
        if isinstance(error, OSError) and error.filename:
            break
        error = error.__cause__
    if isinstance(error, OSError) and error.filename:
        return pathlib.Path(error.filename)
    match = _CHUNK_ERROR.search(str(error))
    if match:
        database = pathlib.Path(match.group(2))
        try:
            return chunk_files(database)[match.group(1)][0]
        except Exception:  # noqa: BLE001 (the manifest too may be unreadable: name the database)
            return database
    return items[0]


def read_step_item(read: Callable[[], T], path: os.PathLike | str, step: int,
                   items: dict[str, pathlib.Path]) -> T:
    """``read()`` (an Orbax restore of ``step``'s array folders ``items``, part name -> folder,
    e.g. ``{"parameters": <step>/params}``), or a ``DamagedCheckpoint`` naming the damaged part
    and file: first from the cheap checks (``verify_item``), else from the error ``read``
    raises."""
    for part, item in items.items():
        problem = verify_item(item)
        if problem is not None:
            raise damaged(path, step, part, *problem)
    quiet_orbax_failures()
    try:
        return read()
    except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise bare Exceptions)
        file = failing_file(e, list(items.values()))
        part = next((part for part, item in items.items() if item in (file, *file.parents)),
                    " or ".join(items))
        raise damaged(path, step, part, file, e) from e


def _orbax_noise(unraisable) -> bool:
    """An unraisable exception a failed Orbax read leaves behind: a late TensorStore callback
    into the closed event loop, or one of Orbax's read coroutines that was never awaited."""
    error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    return ((isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
            or (code is not None and "orbax" in code.co_filename))


def _not_asyncio_noise(record: logging.LogRecord) -> bool:
    """False for a ``never retrieved`` message about one of those reads (an asyncio filter)."""
    message = record.getMessage()
    return not ("exception was never retrieved" in message
                and ("orbax" in message or "TensorStore" in message))


def quiet_orbax_failures() -> None:
    """Drop the messages of the reads a failed Orbax restore leaves in flight (module
    docstring), which come during the read and long after it (when Python collects them); any
    other unraisable exception or asyncio message still shows. Idempotent."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_orbax_noise", False):
        return

    def hook(unraisable) -> None:
        if not _orbax_noise(unraisable):
            previous(unraisable)

    hook.drops_orbax_noise = True
    sys.unraisablehook = hook
    asyncio_log = logging.getLogger("asyncio")
    if _not_asyncio_noise not in asyncio_log.filters:
        asyncio_log.addFilter(_not_asyncio_noise)
