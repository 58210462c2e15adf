"""The constrained-output study (issue 33): its importance-weight estimators on known
distributions, its program end to end on the tiny default, and its page from synthetic rows
(``measure.constrained``, ``report.constrained``, ``experiments.constrained``)."""

import json
import types

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment
from decodelab.measure import constrained as measure
from decodelab.report import constrained as page
from decodelab.report import speed, speed_targets
from experiments import constrained as study

# q, the masked distribution over complete outputs a and b; p, the unconstrained model's
# probability of each (0.4 of its mass on matches): p* = (0.75, 0.25).
Q, P = np.array([0.5, 0.5]), np.array([0.3, 0.1])
EXACT = P / P.sum()


def test_the_estimators_on_outputs_drawn_in_their_exact_proportions():
    log_w = np.log(P / Q)[[0, 0, 1, 1]]  # a, a, b, b: q's own frequencies
    assert measure.total_variation(log_w) == pytest.approx(0.5 * np.abs(EXACT - Q).sum())
    assert measure.kl_exact_masked(log_w) == pytest.approx(np.sum(EXACT * np.log(EXACT / Q)))
    assert measure.kl_masked_exact(log_w) == pytest.approx(np.sum(Q * np.log(Q / EXACT)))
    # An incomplete output counts 0 towards the match rate: 3 complete of 4, then 0.4 * 3/4.
    complete = np.array([1.0, 1.0, 1.0, 0.0])
    assert measure.match_rate(np.log(P / Q)[[0, 1, 0, 1]], complete) == pytest.approx(
        (0.6 + 0.2 + 0.6) / 4)


def test_the_estimators_converge_on_sampled_outputs_and_ignore_the_weights_scale():
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(50))
    p = rng.dirichlet(np.ones(50)) * 0.2  # matches hold 0.2 of the model's mass
    exact = p / p.sum()
    log_w = np.log(p / q)[rng.choice(50, 200_000, p=q)]
    assert measure.total_variation(log_w) == pytest.approx(0.5 * np.abs(exact - q).sum(),
                                                           rel=0.02)
    assert measure.kl_exact_masked(log_w) == pytest.approx(np.sum(exact * np.log(exact / q)),
                                                           rel=0.05)
    assert measure.kl_masked_exact(log_w - 700.0) == pytest.approx(
        np.sum(q * np.log(q / exact)), rel=0.05)  # no underflow at tiny weights
    assert measure.match_rate(log_w, np.ones_like(log_w)) == pytest.approx(0.2, rel=0.02)


def task_row(name, log_w, complete=None, valid=(1.0, 0.0) * 4):
    n = len(log_w)
    complete = [1.0] * n if complete is None else list(complete)
    return {"config": {"point": "task", "task": {"name": name}, "model": {},
                       "sampling": {"masked": n, "unconstrained": len(valid), "new_tokens": 8}},
            "metrics": {"unconstrained_valid": list(valid), "strings": 2,
                        "examples": json.dumps([["yes", 3], ["no", 1]]),
                        "outputs": {"complete": complete, "log_w": list(log_w),
                                    "nll": [2.0 * c for c in complete],
                                    "tokens": [4 * c for c in complete]}}}


def automaton_row():
    return {"config": {"point": "automaton", "model": {}},
            "metrics": {"date_build_s": 0.25, "date_states": 203, "date_edges": 2387,
                        "date_table_bytes": 3 * 2**20, "date_dense": True}}


def test_the_page_tables_and_claims_from_synthetic_rows():
    same = task_row("same", [0.0] * 40, complete=[1.0] * 38 + [0.0] * 2)
    apart = task_row("apart", np.log(P / Q)[[0, 1] * 20])
    rows = [automaton_row(), same, apart]
    table = page.task_table(rows)
    assert [line[0] for line in table.rows] == ["same", "apart"]
    assert table.rows[0][5] == "38 of 38"  # equal weights: every complete output counts
    assert page.task_value("same", "tv")(rows).value == pytest.approx(0.0)
    assert page.task_value("apart", "tv")(rows).value == pytest.approx(0.25)
    assert page.task_value("apart", "kl")(rows).low > 0
    assert page.task_value("missing", "tv")(rows) is None
    assert measure.perplexity(same["metrics"], False).value == pytest.approx(np.exp(0.5))
    assert measure.perplexity(same["metrics"], True).value == pytest.approx(np.exp(0.5))
    assert measure.validity(same["metrics"]).value == pytest.approx(0.5)
    assert measure.weighted_match_rate(same["metrics"]).value == pytest.approx(38 / 40)
    assert page.outputs_table(rows).rows[:2] == [["same", "yes", 3], ["same", "no", 1]]
    assert page.automaton_lines(rows) == [
        "Automaton `date`: 203 states, 2,387 transitions, a dense table of 3.0 MiB, built in "
        "0.25 s from an empty cache."]
    (form,) = study.forms(rows)
    assert form.name == "constrained"
    assert [c.threshold for c in form.claims] == [study.CLOSE_TV] * 2


def test_the_page_plots_the_distances_of_the_judged_tasks(tmp_path):
    rows = [automaton_row(), task_row("apart", np.log(P / Q)[[0, 1] * 20]),
            task_row("short", [0.0, 0.0, 0.0], complete=[1.0, 0.0, 0.0])]
    (form,) = study.forms(rows)
    assert form.plot is page.plot
    page.plot(rows, tmp_path / "constrained.png")  # "short" has no distances and no point
    assert (tmp_path / "constrained.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_task_with_too_few_complete_outputs_is_not_judged():
    row = task_row("short", [0.0, 0.0, 0.0], complete=[1.0, 0.0, 0.0])
    assert measure.distances(row["metrics"]) == {"tv": None, "kl": None, "kl_reverse": None}
    assert measure.perplexity(row["metrics"], True) is None
    assert measure.effective_size(task_row("none", [0.0], [0.0])["metrics"]) == 0.0


def test_the_tiny_study_runs_end_to_end(tmp_path):
    config = experiment.apply_overrides(config_module("constrained").get_config(), {
        "sampling.masked": 4, "sampling.unconstrained": 4, "sampling.new_tokens": 12,
        "sampling.batch_size": 4})
    sweep = [p for p in config_module("constrained").get_sweep()
             if p.get("task.name") in ("yes/no", None)]
    rows = experiment.run(config, sweep, study.evaluate, tmp_path, progress=False)
    task = next(r for r in rows if r["config"]["point"] == "task")["metrics"]
    assert len(task["outputs"]["log_w"]) == 4 and len(task["unconstrained_valid"]) == 4
    done = [t for t, c in zip(task["outputs"]["tokens"], task["outputs"]["complete"]) if c]
    assert all(t >= 2 for t in done)  # "yes" or "no" and the end-of-sequence token
    assert {text for text, _ in json.loads(task["examples"])} <= {"yes", "no"}
    automaton = next(r for r in rows if r["config"]["point"] == "automaton")["metrics"]
    assert automaton["schema_states"] > automaton["email_states"] > 0
    # The decode-speed page's constrained row, on the same model and tokenizer.
    model, tokenizer = study.model_and_tokenizer(config, types.SimpleNamespace(workdir=tmp_path))
    prompts = np.full((2, 3), 5, np.int32)
    timed = measure.speed_row(model, tokenizer, "regex", "[a-z ]*", prompts, 4, 2)
    for name in ("free", "constrained"):
        assert len(timed[f"{name}_generate_reps_s"]) == len(timed[f"{name}_prefill_reps_s"]) == 2
    # Four tokens on a loaded machine can time a step at 0 ms (the clipped difference of two
    # medians); the ratio is then missing, never a division by zero.
    free_ms = timed["free_step_ms"]
    assert timed["constrained_vs_free"] == (
        pytest.approx(timed["constrained_step_ms"] / free_ms) if free_ms else None)


def speed_row(batch, ratio):
    reps = {f"{name}_{kind}_reps_s": [s * (1 + 0.01 * i) for i in range(5)]
            for name, scale in (("free", 1.0), ("constrained", ratio))
            for kind, s in (("generate", 2.0 * scale), ("prefill", 1.0 * scale))}
    return {"config": {"study": "constrained", "prompt_len": 32, "new_tokens": 64},
            "metrics": {**reps, "preset": "smollm2-135m", "batch_size": batch,
                        "free_step_ms": 1.0, "constrained_step_ms": ratio}}


def test_the_bench_page_judges_the_constrained_step_per_batch_size():
    rows = [speed_row(1, 1.05), speed_row(8, 1.5)]
    (target,) = [t for t in speed_targets.TARGETS if t.study == "constrained"]
    claims = target.claims(rows)
    assert [c.text for c in claims] == [
        f"smollm2-135m batch {b}: constrained step / free step (regex, greedy)" for b in (1, 8)]
    assert claims[0].quantity(rows).value == pytest.approx(1.05)
    assert claims[1].quantity(rows).low > 1.15
    assert speed.metric_rows(rows, "constrained")[0]["batch_size"] == 1


def test_the_bench_constrained_sweep_is_smollm2_at_batch_1_and_8():
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config("constrained"), module.get_sweep("constrained"))
    assert [(p.config.preset, p.config.batch_size, p.config.study) for p in points] == [
        ("smollm2-135m", 1, "constrained"), ("smollm2-135m", 8, "constrained")]
