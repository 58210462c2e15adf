"""Argument checks shared by the public entry points.

Each check raises ``ValueError`` with a message that names the argument, its value and what is
allowed, and returns the value in the form the caller stores. Sizes that end up in int32 arrays
(token budgets, cache lengths, beam widths, ...) are checked against the int32 range with
``check_size``, so a typo such as ``2**31`` is refused instead of wrapping negative.
"""

from __future__ import annotations

from typing import Any

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


def check_bool(name: str, flag: Any) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be a bool, got {flag!r}")
    return flag


def check_model(name: str, model: Any) -> None:
    if not isinstance(model, nnx.Module) or not hasattr(model, "config"):
        raise ValueError(f"{name} must be an nnx.Module with a config, got {type(model).__name__}")


def position_limit(model: nnx.Module) -> int | None:
    """The model's position-table size (positions it can encode), or None if it has no table."""
    return getattr(getattr(model, "positions", None), "max_positions", None)
