"""The entry point of every program in ``experiments/``: ``experiment.run_program(main)`` in place
of ``absl.app.run(main)``.

A person's mistake ends as one line on stderr, never as a traceback:

- a command line the flags cannot take (an unknown flag, a config field that does not exist, a
  value of the wrong type, a positional argument) prints ``error: <what, and the nearest valid
  names>`` and exits with status 2 before anything runs;
- a ``ValueError`` raised while the program runs (the library refusing a value, a workdir that
  cannot be used) prints ``error: <message>`` and exits with status 1.

``--verbose``, or the environment variable ``DECODELAB_TRACEBACK=1``, lets the traceback through
instead. Warnings print as one line each, ``warning: <message>``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags
from ml_collections import config_dict
# Not re-exported by the package (public in their module).
from ml_collections.config_flags.config_flags import ConfigFileFlagParser, is_config_flag

from decodelab.experiment.overrides import missing_field
from decodelab.experiment.program import DEFAULT_CONFIG_FILES, check_no_arguments

TRACEBACK_ENV = "DECODELAB_TRACEBACK"
USAGE_STATUS = 2  # the command line is wrong: nothing ran
ERROR_STATUS = 1  # the program refused a value or a state while running
_FAILED_FLAG = re.compile(r"flag --([^=\s]+)=(.*?): ", re.DOTALL)


def _verbose(argv: Sequence[str]) -> bool:
    """Whether to let tracebacks through: ``DECODELAB_TRACEBACK`` set (not to 0), or
    ``--verbose`` among the arguments (read before absl has parsed them, or when it cannot)."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        return True
    return any(arg.lstrip("-") in ("verbose", "verbose=true", "verbose=1") for arg in argv)


def _fail(message: str, status: int) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def _config_flags(flag_values: flags.FlagValues) -> dict[str, Any]:
    return {name: flag_values[name] for name in flag_values
            if is_config_flag(flag_values[name]) and name == flag_values[name].name}


def _config_file(name: str, flag: Any, argv: Sequence[str]) -> str | None:
    for arg in reversed(argv):  # the last one counts
        if arg.startswith((f"--{name}=", f"-{name}=")):
            return arg.split("=", 1)[1]
    return flag.default_unparsed if isinstance(flag.default_unparsed, str) else None


def _configs(flag_values: flags.FlagValues, argv: Sequence[str]) -> dict[str, Any]:
    """The config each config flag would load from ``argv`` (before any override), by flag
    name; a file that fails to load is left out (absl's own message says why)."""
    configs = {}
    for name, flag in _config_flags(flag_values).items():
        filename = _config_file(name, flag, argv)
        try:
            config = ConfigFileFlagParser(name).parse(filename) if filename else None
        except Exception:  # noqa: BLE001 - absl's own message says what is wrong with the file
            continue
        if isinstance(config, config_dict.ConfigDict):  # not a missing file's stand-in
            configs[name] = config
    return configs


def _override_problem(configs: dict[str, Any], argv: Sequence[str]) -> str | None:
    """The first ``--<config>.<key>`` in ``argv`` whose key names no field of its config."""
    for name, config in configs.items():
        for arg in argv:
            if re.match(rf"-{{1,2}}(no)?{re.escape(name)}\.", arg):
                key = arg.split("=", 1)[0].split(".", 1)[1]
                problem = missing_field(config, key) if "[" not in key else None
                if problem is not None:
                    return f"--{name}.{key}: {problem}"
    return None


def _flag_message(error: Exception, configs: dict[str, Any]) -> str:
    """absl's message of a flag that failed to parse, on one line: a config file's traceback
    (which ml_collections puts in the message) is cut to its last line, and a config field's
    value of the wrong type is said with the field's type."""
    text = str(error).strip()
    head = _FAILED_FLAG.match(text)
    if head is None:
        return text.splitlines()[-1]
    name, value = head[1], head[2]
    section, _, key = name.partition(".")
    config = configs.get(section)
    if key and config is not None and missing_field(config, key) is None:
        field = functools.reduce(lambda node, part: node[part], key.split("."), config)
        kind = type(field).__name__
        return f"--{name}={value}: {key} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, " \
               f"got {value!r}"
    reason = text.splitlines()[-1] if "\n" in text else text[head.end():]
    return f"--{name}={value}: {reason}"


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, a failure as one line (status 2); positional arguments refused. A
    config flag given no file gets its default (``define_config_file``) on the command line,
    ``sys.argv`` included: ml_collections reads the overrides from there."""
    named = [name for name in DEFAULT_CONFIG_FILES
             if not any(arg.startswith((f"--{name}=", f"-{name}=")) for arg in argv[1:])]
    argv = [argv[0], *(f"--{name}={DEFAULT_CONFIG_FILES[name]}" for name in named), *argv[1:]]
    sys.argv[:] = argv
    for name, flag in _config_flags(flags.FLAGS).items():
        path = (_config_file(name, flag, argv) or "").split(":", 1)[0]
        if path and not os.path.isfile(path):
            _fail(f"--{name}={path}: the config file does not exist", USAGE_STATUS)
    try:
        rest = flags.FLAGS(argv)
    except Exception as e:  # flags.Error, and what ml_collections raises for a missing field
        if _verbose(argv):
            raise
        configs = _configs(flags.FLAGS, argv)
        _fail(_override_problem(configs, argv) or _flag_message(e, configs), USAGE_STATUS)
    try:
        check_no_arguments(rest)
    except ValueError as e:
        _fail(str(e), USAGE_STATUS)
    return rest


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def run_program(main: Callable[[list[str]], Any]) -> None:
    """Run ``main`` as ``absl.app.run`` does, with a person's mistakes as one line each (see the
    module docstring). Defines ``--verbose``; call it under ``if __name__ == "__main__":``."""
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, f"Show the traceback of an error (also "
                          f"{TRACEBACK_ENV}=1) instead of one line.")

    def guarded(argv: list[str]) -> Any:
        try:
            return main(argv)
        except (ValueError, app.UsageError) as e:
            if _verbose(sys.argv):
                raise
            _fail(str(e), USAGE_STATUS if isinstance(e, app.UsageError) else ERROR_STATUS)

    warnings.formatwarning = _one_line_warning
    app.run(guarded, flags_parser=_parse_flags)
