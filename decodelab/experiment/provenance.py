"""Provenance of a result row: the git state of the decodelab checkout, library versions, the
machine, the XLA flags and the command that ran."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import pathlib
import platform
import resource
import subprocess
from typing import Any

from decodelab.report.pages import current_command

PROVENANCE_FIELDS = ("git_commit", "git_dirty", "python_version", "jax_version", "jaxlib_version",
                     "flax_version", "backend", "device_kind", "device_count", "cpu_count",
                     "xla_flags", "command")


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
        # The XLA settings the process ran with ("" if none): they change the compiled programs.
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    return tuple(fields.items())


def provenance(command: str | None = None) -> dict[str, Any]:
    """PROVENANCE_FIELDS of this process: git state of the decodelab checkout, versions, machine,
    and the command (this process's unless given). Computed once per process."""
    command = current_command() if command is None else command
    return {**dict(_static_provenance()), "command": command}


def cpu_seconds() -> tuple[float, float] | None:
    """``(machine, own)``: CPU seconds spent so far by every process on the machine (busy time of
    all cores, from ``/proc/stat``) and by this process with its waited-for children. The growth of
    ``machine - own`` over an interval is what other processes took from the cores meanwhile, which
    a load average (a decaying count of runnable threads, this process's own included) cannot
    separate. None where ``/proc/stat`` is unreadable (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted in user already).
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    own = sum(getattr(resource.getrusage(who), part) for who in
              (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for part in ("ru_utime", "ru_stime"))
    return busy / os.sysconf("SC_CLK_TCK"), own
