"""Base configs and overrides: what a config must hold, its hash, and dotted-key overrides.

A point is identified by its config hash: the first 16 hex digits of the sha256 of the resolved
config as canonical JSON (sorted keys). The same resolved config always gets the same hash, however
it was reached. Every field counts, even one that cannot change a result (an evaluation batch
size): changing it makes new points.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from ml_collections import config_dict

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
