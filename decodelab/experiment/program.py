"""Experiment programs: the absl flags every program in ``experiments/`` defines, and running the
sweep they name.

Every program that defines its flags here also gets ``--coordinator_address``,
``--num_processes`` and ``--process_id`` (``sharding.define_flags``): started once per host with
them, its processes join one JAX runtime (``jax.distributed``) before the sweep runs, and
process 0 alone writes the rows."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import flags, logging
from ml_collections import config_dict, config_flags

from decodelab import sharding
from decodelab.experiment.overrides import check_base_config
from decodelab.experiment.runner import PointContext, SweepOptions, run
from decodelab.experiment.sweep import load_sweep, parse_shard
from decodelab.report.rows import ROWS_FILE


@dataclasses.dataclass(frozen=True)
class ExperimentFlags:
    """The flags of an experiment program (see ``define_flags``)."""

    config: flags.FlagHolder
    workdir: flags.FlagHolder
    sweep_shard: flags.FlagHolder
    extend_sweep: flags.FlagHolder
    rerun_shared: flags.FlagHolder
    flag_values: flags.FlagValues


# The default config file of each config flag of the program (flags.FLAGS), by flag name: put on
# the command line by ``run_program`` when it names none (see ``define_config_file``).
DEFAULT_CONFIG_FILES: dict[str, str] = {}


def define_config_file(name: str, default: str | None, help_text: str,
                       flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
    """A locked config-file flag (``--<name>=path.py[:arg]``, fields overridden with
    ``--<name>.<key>=<value>``) whose ``default`` file is not loaded here: ``run_program`` puts
    ``--<name>=<default>`` on the command line when it names no file. (ml_collections would load a
    default while the program's module is imported, reading the overrides then, so a misspelt
    override would fail the import with a traceback instead of one line.)"""
    if default is not None and flag_values is flags.FLAGS:
        DEFAULT_CONFIG_FILES[name] = default
        help_text += f" Default: {default}."
    return config_flags.DEFINE_config_file(name, None, help_text, lock_config=True,
                                           flag_values=flag_values)


def define_flags(default_config: str | None = None) -> ExperimentFlags:
    """Define ``--config`` (a locked config file, so a misspelt override fails by name; see
    ``define_config_file``), ``--workdir`` (default ``runs/<experiment>``), ``--sweep_shard``
    (``i/n``, default ``0/1``), ``--extend_sweep`` (see ``SweepOptions.extend``),
    ``--rerun_shared`` (``SweepOptions.rerun_shared``) and the
    multi-process flags (``sharding.define_flags``; not for an imported program).

    When the global flags are already parsed or these names are taken, the module is being imported
    by another program (e.g. ``experiments.report`` reading its ``report`` function): the flags then
    go to a private FlagValues, so the import neither clashes with nor changes the program's flags.
    """
    names = ("config", "workdir", "sweep_shard", "extend_sweep", "rerun_shared")
    shared = flags.FLAGS
    flag_values = (flags.FlagValues() if shared.is_parsed() or any(n in shared for n in names)
                   else shared)
    if flag_values is shared:
        sharding.define_flags(shared)
    return ExperimentFlags(
        config=define_config_file(
            "config", default_config, "Config file, `path.py` or `path.py:arg`; override fields "
            "with --config.<key>=<value>.", flag_values),
        workdir=flags.DEFINE_string(
            "workdir", None, "Folder for rows.jsonl and cached models; default runs/<experiment>.",
            flag_values=flag_values),
        sweep_shard=flags.DEFINE_string(
            "sweep_shard", "0/1", "Run shard i of n of the sweep (points whose index % n == i).",
            flag_values=flag_values),
        extend_sweep=flags.DEFINE_bool(
            "extend_sweep", False, "Add this run's points to a --workdir whose rows of this sweep "
            "ran with other settings (without it such a run is refused, naming the fields that "
            "differ).", flag_values=flag_values),
        rerun_shared=flags.DEFINE_bool(
            "rerun_shared", False, "Measure again the points whose row says other processes kept "
            "the machine's cores busy while they ran (the run ends with a warning naming them), "
            "replacing their rows.", flag_values=flag_values),
        flag_values=flag_values,
    )


def check_no_arguments(argv: Sequence[str]) -> None:
    """Refuse positional arguments: ``argv`` is what ``absl.app.run`` passes to ``main`` (the
    program's name, then what no flag took). A program takes flags only, so a word after them is
    a mistake (a value given without ``--name=``, or a space inside a flag), not something to
    ignore."""
    extra = list(argv[1:])
    if extra:
        raise ValueError(f"this program takes flags only (--name=value), got the positional "
                         f"argument(s) {extra}; write overrides as --config.<key>=<value>")


def run_from_flags(experiment_flags: ExperimentFlags,
                   point_fn: Callable[[config_dict.ConfigDict, PointContext], Mapping[str, Any]],
                   argv: Sequence[str] = ()) -> list[dict]:
    """Run the sweep of the parsed flags (see ``run``); print where the rows are and how to render
    them. Ctrl-C stops after saying what was kept. ``argv`` is ``main``'s argument: positional
    arguments in it are refused (``check_no_arguments``). With ``--coordinator_address`` the
    processes join one runtime first (``sharding.initialize_from_flags``)."""
    check_no_arguments(argv)
    if not experiment_flags.flag_values.is_parsed():
        raise ValueError("run_from_flags needs parsed flags: call it from main under absl.app.run, "
                         "in the program that called define_flags")
    sharding.initialize_from_flags()
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
    options = SweepOptions(shard_index, shard_count, name=pathlib.Path(filename).name,
                           extend=experiment_flags.extend_sweep.value,
                           rerun_shared=experiment_flags.rerun_shared.value)
    try:
        rows = run(config, sweep, point_fn, workdir, options=options)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished point is in {workdir / ROWS_FILE}; run the same "
              "command again to continue", file=sys.stderr)
        sys.exit(130)
    print(f"{len(rows)} points of shard {shard_index}/{shard_count} in {workdir / ROWS_FILE}; "
          f"tables and plots: python -m experiments.report --workdir={workdir}")
    return rows
