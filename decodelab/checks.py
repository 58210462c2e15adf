"""Argument checks shared by the public entry points.

Each check raises ``ValueError`` with a message that names the argument, its value and what is
allowed, and returns the value in the form the caller stores: ``check_int`` and ``check_size``
for ints, ``check_number`` for finite numbers in a range (``describe_range`` words it),
``check_bool``, ``check_one_of``, ``token_ids`` for a list of token ids, and ``check_path``
for every path the library reads or writes. Sizes that end up in int32 arrays (token budgets,
cache lengths, beam widths, ...) are checked against the int32 range with ``check_size``, so a
typo such as ``2**31`` is refused instead of wrapping negative.

Sizes are also bounded by memory: before a decoder allocates its cache and buffers it lists their
bytes and ``check_memory`` refuses the call when the total exceeds the memory limit (by default
the device's memory: an accelerator's ``memory_stats()["bytes_limit"]``, or on CPU the machine's
physical memory; ``set_memory_limit`` changes it). The listed buffers are a lower bound of what
the call needs, so a refused call could never have run; a typo such as ``max_len=10**9`` answers
at once instead of swapping the machine to a halt.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
import tempfile
from typing import Any

import jax
import numpy as np
from flax import nnx

INT32_MAX = 2**31 - 1


def is_int(x: Any) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return int(value)


def check_size(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int in ``[minimum, 2**31 - 1]``: a size stored as int32."""
    if is_int(value) and value > INT32_MAX:
        raise ValueError(f"{name} must be <= 2**31 - 1 (it is stored as int32), got {value!r}")
    return check_int(name, value, minimum)


def token_ids(name: str, ids: Any, vocab_size: int) -> np.ndarray:
    """``ids`` as a non-empty 1-D int32 array of token ids, or a ValueError naming ``name``."""
    if isinstance(ids, (str, bytes)) or isinstance(ids, jax.core.Tracer):
        raise ValueError(f"{name} must be a list of token ids, got {ids!r}")
    try:
        array = np.asarray(ids)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of token ids, got {ids!r}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of token ids, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty; it needs at least one token")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold int token ids, got {ids!r}")
    bad = np.flatnonzero((array < 0) | (array >= vocab_size))
    if bad.size:
        raise ValueError(f"{name} holds token id {int(array[bad[0]])} at index {int(bad[0])}; "
                         f"ids must be in [0, {vocab_size})")
    return array.astype(np.int32)


def check_bool(name: str, flag: Any) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be a bool, got {flag!r}")
    return flag


def is_finite_number(x: Any) -> bool:
    """A finite Python or NumPy int or float, not a bool."""
    return (isinstance(x, (int, float, np.integer, np.floating))
            and not isinstance(x, (bool, np.bool_)) and math.isfinite(x))


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                 open_low: bool = False, open_high: bool = False) -> Any:
    """``value`` (unchanged) as a finite number from ``low`` to ``high``, both ends included unless
    ``open_low`` / ``open_high``; None: no bound on that side. The message names the range:
    ``temperature must be a finite number > 0, got 0``, ``b1 must be a finite number in [0, 1)``."""
    if is_finite_number(value):
        above = low is None or (value > low if open_low else value >= low)
        below = high is None or (value < high if open_high else value <= high)
        if above and below:
            return value
    bounds = describe_range(low, high, open_low=open_low, open_high=open_high)
    raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}")


def describe_range(low: float | None, high: float | None, *, open_low: bool = False,
                   open_high: bool = False) -> str:
    """``check_number``'s range in words, with a leading space: `` in (0, 1]``, `` >= 0.01``;
    empty when neither end is bounded."""
    if low is not None and high is not None:
        return f" in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    if low is not None:
        return f" {'>' if open_low else '>='} {low}"
    if high is not None:
        return f" {'<' if open_high else '<='} {high}"
    return ""


def check_one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value``, one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def as_path(name: str, value: Any) -> pathlib.Path:
    """``value`` as a ``pathlib.Path``; an empty path (which would quietly mean the current
    directory) or a value that is not a path is refused."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError(f"{name} must be a non-empty path (str or os.PathLike), got {value!r}")
    return pathlib.Path(value)


def check_path(name: str, value: Any, kind: str, *, write: bool = False,
               what: str = "") -> pathlib.Path:
    """``value`` (a str or ``os.PathLike``) as a ``pathlib.Path`` to a ``kind`` (``"file"`` or
    ``"directory"``; ``what`` qualifies it in messages: ``"checkpoint "``). An empty path is
    refused (it would quietly mean the current directory). To read, the path must exist as that
    kind. To write, it must not exist as anything else, and the folder that will hold what is
    written (the directory itself, or a file's parent) is created here and a file is written
    and removed there: a path that cannot be written is refused before any work starts."""
    check_one_of("kind", kind, ("file", "directory"))
    path = as_path(name, value)
    if path.exists() and path.is_dir() != (kind == "directory"):
        found = "directory" if path.is_dir() else "file"
        raise ValueError(f"{name} must be a {what}{kind}, got a {found}: {str(path)!r}")
    if not write:
        if not path.exists():
            raise ValueError(f"{name} must be an existing {what}{kind}, got {str(path)!r}")
        return path
    folder = path if kind == "directory" else path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = e.filename if e.filename is not None else folder
        raise ValueError(f"{name} must be a path this process can write, got {str(path)!r}: "
                         f"cannot write {str(where)!r} ({e.strerror})") from None
    return path


def check_model(name: str, model: Any) -> None:
    if not isinstance(model, nnx.Module) or not hasattr(model, "config"):
        raise ValueError(f"{name} must be an nnx.Module with a config, got {type(model).__name__}")


def tokenizer_size(name: str, tokenizer: Any, vocab_size: int) -> int | None:
    """The number of ids ``tokenizer`` has (``len(tokenizer)`` where defined, as a Hugging Face
    tokenizer's counts its added tokens, else its ``vocab_size``; None when it says neither), for
    a model of ``vocab_size``. A model's vocabulary may be padded past its tokenizer's (nanoGPT's
    50304 for GPT-2's 50257): the ids from the tokenizer's size on are padding, never text. A
    tokenizer with more ids than the model is refused: the model cannot read its ids."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size",
                                                                         None)
    if size is None:
        return None
    if not is_int(size) or size < 1:
        raise ValueError(f"{name} must report its number of ids as an int >= 1 (len or "
                         f"vocab_size), got {size!r} from {tokenizer!r}")
    if size > vocab_size:
        raise ValueError(f"{name} has {size} ids but the model's vocabulary has {vocab_size}; a "
                         f"tokenizer must have at most the model's vocab_size ids (a model's "
                         f"vocabulary may be padded past its tokenizer's, never the reverse)")
    return int(size)


def position_limit(model: nnx.Module) -> int | None:
    """The model's position-table size (positions it can encode), or None if it has no table."""
    return getattr(getattr(model, "positions", None), "max_positions", None)


# --- Memory ---------------------------------------------------------------------------------------

_memory_limit: int | None = None  # set by set_memory_limit; None: the device's memory


@functools.cache
def device_memory() -> tuple[int, str]:
    """Bytes of memory of this process's first device and where the number comes from: an
    accelerator's ``memory_stats()["bytes_limit"]``, or (CPU, where jax reports none) the physical
    memory. Only a process's own devices report their memory (with several processes,
    ``jax.devices()[0]`` may be another host's)."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"the memory of {device.device_kind}"
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's memory"


def set_memory_limit(nbytes: int | None) -> int | None:
    """Set the most bytes one decoder call's cache and buffers may take; None restores the default
    (the device's memory). Returns the previous setting."""
    global _memory_limit
    if nbytes is not None:
        nbytes = check_int("nbytes", nbytes, 1)
    previous, _memory_limit = _memory_limit, nbytes
    return previous


def memory_limit() -> tuple[int, str]:
    """The memory limit in bytes, and where it comes from."""
    if _memory_limit is not None:
        return _memory_limit, "set by set_memory_limit"
    return device_memory()


def nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (Python ints: no overflow)."""
    return math.prod(int(n) for n in shape) * jax.numpy.dtype(dtype).itemsize


def kv_cache_bytes(cfg: Any, batch_size: int, max_len: int) -> int:
    """Bytes of a float ``KVCache`` of ``cfg``: keys and values, ``[L, B, K, S, H]`` each (a
    quantized cache takes less, so the estimate is an upper bound)."""
    return 2 * nbytes((cfg.n_layers, batch_size, max_len, cfg.n_kv_heads, cfg.head_dim),
                      cfg.dtype)


def format_bytes(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def check_memory(call: str, buffers: dict[str, int], sizes: dict[str, int]) -> int:
    """Refuse ``call`` before it allocates when its ``buffers`` (name -> bytes) exceed the memory
    limit; ``sizes`` (argument -> value) are the arguments that set them, named in the message.
    Returns the total bytes."""
    total = sum(buffers.values())
    limit, source = memory_limit()
    if total > limit:
        parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in buffers.items())
        args = ", ".join(f"{name}={value}" for name, value in sizes.items())
        raise ValueError(f"{call} with {args} needs {format_bytes(total)} ({parts}), more than "
                         f"the memory limit of {format_bytes(limit)} ({source}); lower "
                         f"{' or '.join(sizes)}, or raise the limit with "
                         f"decodelab.set_memory_limit")
    return total
