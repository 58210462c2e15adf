"""Base configs and overrides: what a config must hold, its hash, and dotted-key overrides.

A point is identified by its config hash: the first 16 hex digits of the sha256 of the resolved
config as canonical JSON (sorted keys). The same resolved config always gets the same hash, however
it was reached. Every field counts, even one that cannot change a result (an evaluation batch
size): changing it makes new points.

A field added to an experiment after its rows were kept would change every point's hash, and so
rerun every point. The base config names such fields in its section ``added_fields`` (top-level
field -> the value the kept rows ran with); the hash leaves out ``added_fields`` and each of them
while it holds that value, so the kept rows keep their points and only points that set another
value are new.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ml_collections import config_dict

from decodelab.report.rows import config_leaves

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The base config's section of fields added after rows were kept (module docstring).
ADDED_FIELDS = "added_fields"


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
    added = config.get(ADDED_FIELDS)
    if added is None:
        return
    if not isinstance(added, config_dict.ConfigDict):
        raise ValueError(f"config.{ADDED_FIELDS} must be a section (field -> the value rows kept "
                         f"before it existed ran with), got {added!r}")
    for name, value in added.items():
        if name == ADDED_FIELDS or name not in config:
            raise ValueError(f"config.{ADDED_FIELDS} names {name!r}, which is not a top-level "
                             f"field of the config (fields: {sorted(config.keys())})")
        if isinstance(value, config_dict.ConfigDict) or isinstance(config[name],
                                                                   config_dict.ConfigDict):
            raise ValueError(f"config.{ADDED_FIELDS}.{name} must name a field holding a value, "
                             f"not a section; got {value!r}")


def config_hash(config: config_dict.ConfigDict | Mapping[str, Any]) -> str:
    """First 16 hex digits of the sha256 of ``config`` as canonical JSON (sorted keys, no spaces),
    leaving out ``added_fields`` and each field it names while at its value (module docstring)."""
    resolved = config.to_dict() if isinstance(config, config_dict.ConfigDict) else dict(config)
    added = resolved.pop(ADDED_FIELDS, None) or {}
    for name, value in added.items():
        if name in resolved and json.dumps(resolved[name]) == json.dumps(value):
            del resolved[name]
    for key, value in config_leaves(resolved):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config field {key} must be a finite number, got {value}")
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
        if key.split(".")[0] == ADDED_FIELDS:
            raise ValueError(f"a sweep point must not override {key!r}: {ADDED_FIELDS} records "
                             "what kept rows ran with; override the field itself")
        problem = missing_field(result, key)
        if problem is not None:
            raise ValueError(f"override key {key!r} does not exist in the config: {problem}")
        *sections, name = key.split(".")
        node = result
        for part in sections:
            node = node[part]
        if isinstance(node[name], config_dict.ConfigDict):
            raise ValueError(f"override key {key!r} names a section; override its fields "
                             f"({key}.<field>) instead")
        try:
            node[name] = value
        except TypeError as e:
            raise ValueError(f"override {key}={value!r} has the wrong type: {e}") from None
    return result


def _field_paths(section: config_dict.ConfigDict, prefix: str = "") -> list[str]:
    paths = []
    for name, value in section.items():
        paths.append(prefix + name)
        if isinstance(value, config_dict.ConfigDict):
            paths += _field_paths(value, f"{prefix}{name}.")
    return paths


def _initials(name: str) -> str:
    return "".join(part[:1] for part in name.split("_"))


def _near(name: str, names: list[str], count: int) -> list[str]:
    """``names`` close to ``name`` in spelling, or abbreviated by it (``lr``: ``learning_rate``)."""
    found = difflib.get_close_matches(name, names, n=count, cutoff=0.6)
    return found + [n for n in names if "_" in n and _initials(n) == name and n not in found]


def _nearest_fields(config: config_dict.ConfigDict, key: str, count: int = 3) -> list[str]:
    """Up to ``count`` dotted fields of ``config`` nearest to the dotted ``key``, which names
    none: the fields beside its first missing part that are spelt like it (the rest of the key
    kept), else any field whose last name is spelt like the key's (``report.new_tokens`` for
    ``new_tokns``)."""
    node, parts = config, key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, config_dict.ConfigDict):
            return []
        if part not in node:
            prefix, rest = parts[:depth], parts[depth + 1:]
            beside = [".".join([*prefix, name, *rest]) for name in _near(part, list(node), count)]
            if beside:
                return beside[:count]
            break
        node = node[part]
    paths = _field_paths(config)
    leaves = _near(parts[-1], sorted({p.rsplit(".", 1)[-1] for p in paths}), count)
    return [p for p in paths if p.rsplit(".", 1)[-1] in leaves][:count]


def missing_field(config: config_dict.ConfigDict, key: str) -> str | None:
    """Why the dotted ``key`` names no field of ``config`` (the first part that does not exist,
    the nearest valid names and the fields of the section it was looked for in); None if it
    names one."""
    node, parts = config, key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the config"
        if not isinstance(node, config_dict.ConfigDict):
            return f"{where} is a value, not a section"
        if part not in node:
            near = _nearest_fields(config, key)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            return (f"{where} has no field {part!r}{hint} ({where}'s fields: "
                    f"{', '.join(sorted(node.keys()))})")
        node = node[part]
    return None
