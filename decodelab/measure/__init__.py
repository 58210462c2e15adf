"""Measurements: perplexity and text statistics, generation quality, the KL scoreboard, the
roofline, compile counting and bootstrap intervals.

``decodelab.measure.perplexity`` is the module (its function is ``perplexity.perplexity``): a
function re-exported here under the module's name would hide the module from
``from decodelab.measure import perplexity``."""

from decodelab.measure.compiles import count_traces
from decodelab.measure.quality import held_out_prompts, quality_row
from decodelab.measure.roofline import StepCost, measure_bandwidth, step_cost
from decodelab.measure.scoreboard import Scoreboard, compare
from decodelab.measure.stats import Interval, bootstrap, bootstrap_difference, bootstrap_ratio

__all__ = ["Interval", "Scoreboard", "StepCost", "bootstrap", "bootstrap_difference",
           "bootstrap_ratio", "compare", "count_traces", "held_out_prompts", "measure_bandwidth",
           "quality_row", "step_cost"]
