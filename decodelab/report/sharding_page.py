"""The sharding study's page parts, from the rows of ``experiments/sharding.py``: ``plan`` rows
(one per chip, model and total batch: ``measure.sharding_plan.plan_point``, computed from published
figures) and ``measure`` rows (one per mesh: greedy ``generate`` timed on fake CPU devices,
``measure.mesh_timing``; mesh ``none`` is one device without a mesh, the reference)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import stats
from decodelab.measure.mesh_timing import ONE_DEVICE
from decodelab.measure.stats import Interval
from decodelab.measure.timing import SHARED_CORES
from decodelab.report.pages import other_cores
from decodelab.report.plots import Axes, line_plot
from decodelab.report.tables import Table

Row = Mapping[str, Any]
Rows = Sequence[Row]
PLOTTED = "µs per layer and step"


def part(rows: Rows, name: str) -> list[Row]:
    """The rows of ``name``: ``plan`` or ``measure``."""
    return [r for r in rows if r["config"]["part"] == name]


def reference(rows: Rows) -> Row | None:
    """The one-device row, or None."""
    return next((r for r in part(rows, "measure") if r["config"]["mesh"] == ONE_DEVICE), None)


def meshes(rows: Rows) -> list[Row]:
    return [r for r in part(rows, "measure") if r["config"]["mesh"] != ONE_DEVICE]


def vs_one_device(row: Row, base: Row) -> Interval | float:
    """``row``'s median generate time over the one-device row's, with its bootstrap interval over
    the timed calls (one call each: the plain ratio)."""
    a, b = row["metrics"]["rep_s"], base["metrics"]["rep_s"]
    if len(a) > 1 and len(b) > 1:
        return stats.bootstrap_ratio(stats.median, a, b)
    return stats.median(a) / stats.median(b)


def same_tokens_share(rows: Rows) -> float | None:
    """The share of meshes whose greedy tokens equal the one device's (None: nothing to compare)."""
    base, found = reference(rows), meshes(rows)
    if base is None or not found:
        return None
    digest = base["metrics"]["tokens_sha256"]
    return sum(r["metrics"]["tokens_sha256"] == digest for r in found) / len(found)


def fastest_mesh_ratio(rows: Rows) -> Interval | float | None:
    """The mesh with the shortest median generate time, over one device (``vs_one_device``)."""
    base, found = reference(rows), meshes(rows)
    if base is None or not found:
        return None
    fastest = min(found, key=lambda r: r["metrics"]["median_ms"])
    return vs_one_device(fastest, base)


def sharing_text(rows: Rows) -> str:
    """Whether other processes shared the cores while the meshes were timed: the cores they kept
    busy during a point (``pages.other_cores``) against ``timing.SHARED_CORES``, and the 1-minute
    load average the measured rows recorded at their ends."""
    loads = [r["metrics"]["load_average"] for r in part(rows, "measure")]
    if not loads:
        return "No point was measured."
    busy = other_cores(rows)
    worst = max(busy, default=0.0)
    who = ("Other processes shared the cores" if worst >= SHARED_CORES
           else "No other process shared the cores")
    measured = f"up to {worst:.2f} cores busy during a point; " if busy else ""
    return (f"{who} ({measured}load average {min(loads):.1f} to {max(loads):.1f} at the ends of "
            "the measured points, the program's own threads included).")


def mesh_label(mesh: str) -> str:
    return "one device" if mesh == ONE_DEVICE else mesh.replace("x", " x ")


def main_table(rows: Rows) -> Table:
    """One line per mesh: compile seconds (the first call minus the median), the median generate
    time, per new token, over one device's (with its interval), and whether the tokens equal one
    device's."""
    base, lines = reference(rows), []
    for row in part(rows, "measure"):
        c, m = row["config"], row["metrics"]
        lines.append([mesh_label(c["mesh"]), m["compile_s"], m["median_ms"], m["ms_per_token"],
                      None if base is None else 1.0 if row is base else vs_one_device(row, base),
                      None if base is None else
                      ("yes" if m["tokens_sha256"] == base["metrics"]["tokens_sha256"] else "NO")])
    return Table(["mesh (data x model)", "compile (s)", "generate (ms)", "ms / new token",
                  "time / one device's", "tokens = one device"], lines)


def _plan_table(rows: Rows, columns: Mapping[str, str]) -> Table:
    keys = {"chip": "chip", "model": "plan_model", "B": "batch"}
    return Table([*keys, *columns.values()],
                 [[r["config"][k] for k in keys.values()] + [r["metrics"][k] for k in columns]
                  for r in part(rows, "plan")])


def bytes_table(rows: Rows) -> Table:
    """Per layer and decode step: the plan's bytes (MB, all devices; link: per device)."""
    return _plan_table(rows, {"params_m": "params (M)", "n_heads": "heads N",
                              "n_kv_heads": "KV heads K", "weight_mb": "weights MB",
                              "kv_mb": "KV MB", "allreduce_mb": "all-reduce payload MB",
                              "link_mb": "link MB per device", "kv_split": "KV heads split"})


def times_table(rows: Rows) -> Table:
    """Per layer and decode step: TP and DP over 8 chips (µs), which is faster, whether DP fits."""
    return _plan_table(rows, {"tp_us": "TP over 8 (µs)", "dp_us": "DP over 8 (µs)",
                              "faster": "faster", "dp_fits": "DP fits one chip",
                              "dp_gb_per_chip": "DP GB per chip"})


def break_even_table(rows: Rows) -> Table:
    """Per chip and model: the total batch below which TP beats DP (0: never; n/a: the heads do
    not split over 8), and the published figures it came from."""
    seen = {(r["config"]["chip"], r["config"]["plan_model"]): r["metrics"]
            for r in part(rows, "plan")}
    return Table(["chip", "model", "break-even total batch", "HBM TB/s", "link GB/s",
                  "all-reduce latency (µs)", "source"],
                 [[chip, model, m["break_even_batch"], m["hbm_tb_s"], m["link_gb_s"],
                   m["allreduce_latency_us"], m["source"]] for (chip, model), m in seen.items()])


def tp_layer_table(rows: Rows) -> Table:
    """Per chip and batch: the layer weight size (MB) above which TP over 8 beats DP (D 4096)."""
    seen = {(r["config"]["chip"], r["config"]["batch"]): r["metrics"]["tp_pays_above_layer_mb"]
            for r in part(rows, "plan")}
    return Table(["chip", "B", "TP pays above (MB per layer)"],
                 [[chip, batch, mb] for (chip, batch), mb in seen.items()])


def plan_plot(rows: Rows, path: pathlib.Path, model: str) -> pathlib.Path:
    """TP and DP µs per layer and step against the total batch for ``model``, one line per chip
    and layout (log axes)."""
    lines = [{"config": {"batch": r["config"]["batch"],
                         "layout": f"{r['config']['chip']}, {layout}"},
              "metrics": {PLOTTED: r["metrics"][f"{layout.lower()}_us"]}}
             for layout in ("TP", "DP") for r in part(rows, "plan")
             if r["config"]["plan_model"] == model]
    return line_plot(lines, path, x="batch", y=PLOTTED, group="layout",
                     axes=Axes(logx=True, logy=True, title=f"{model}: one layer, one step"))
