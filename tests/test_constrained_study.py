"""The constrained-output study (issue 33): its estimators on known distributions and its page
from synthetic rows (``measure.constrained``, ``report.constrained``)."""

import numpy as np
import pytest

from decodelab.measure import constrained as measure
from decodelab.report import constrained as page


def pooled(masked, exact, weights=None):
    strings = masked + exact
    return (np.array(strings, float), np.array([0] * len(masked) + [1] * len(exact), float),
            np.ones(len(strings)) if weights is None else np.asarray(weights, float))


def test_total_variation_and_kl_of_known_frequencies():
    """Masked 3:1 over strings 0 and 1, exact 1:1: TV 0.25; KL with pseudo-count 0.5."""
    columns = pooled([0, 0, 0, 1], [0, 1, 0, 1])
    assert measure.total_variation(2)(*columns) == pytest.approx(0.25, abs=1e-12)
    p, q = np.array([2.5, 2.5]) / 5, np.array([3.5, 1.5]) / 5
    assert measure.kl_exact_masked(2)(*columns) == pytest.approx(np.sum(p * np.log(p / q)))


def test_importance_weights_count_as_frequencies():
    """Exact outputs weighted 3 and 1 are the 3:1 distribution the masked side draws: TV 0."""
    columns = pooled([0, 0, 0, 1], [0, 1], weights=[1, 1, 1, 1, 3, 1])
    assert measure.total_variation(2)(*columns) == pytest.approx(0.0, abs=1e-12)


def task_row(name, masked, exact):
    string, sampler, weight = pooled(masked, exact)
    n = len(string)
    return {"config": {"point": "task", "task": {"name": name},
                       "sampling": {"masked": len(masked), "unconstrained": 8,
                                    "min_accepted": 2}, "model": {}},
            "metrics": {"exact_method": "rejection", "strings": int(string.max()) + 1,
                        "unconstrained_valid": [1.0, 0.0] * 4,
                        "outputs": {"string": string.tolist(), "sampler": sampler.tolist(),
                                    "weight": weight.tolist(), "nll": [2.0] * n,
                                    "tokens": [4] * n}}}


def speed_row(batch, ratio):
    reps = {f"{name}_{kind}_reps_s": [s * (1 + 0.01 * i) for i in range(5)]
            for name, scale in (("free", 1.0), ("constrained", ratio))
            for kind, s in (("generate", 2.0 * scale), ("prefill", 1.0 * scale))}
    return {"config": {"point": "speed", "speed": {"batch_size": batch}, "model": {}},
            "metrics": {**reps, "free_step_ms": 1.0, "constrained_step_ms": ratio}}


def test_the_page_tables_and_claims_from_synthetic_rows():
    rows = [task_row("same", [0, 1] * 20, [0, 1] * 20), task_row("apart", [0] * 40, [1] * 40),
            speed_row(1, 1.05), speed_row(8, 1.5)]
    table = page.task_table(rows)
    assert [line[0] for line in table.rows] == ["same", "apart"]
    assert page.task_value("apart", "tv")(rows).value == pytest.approx(1.0)
    assert page.task_value("same", "tv")(rows).value == pytest.approx(0.0)
    assert page.task_value("missing", "tv")(rows) is None
    assert page.step_ratio_at(1)(rows).value == pytest.approx(1.05)
    assert page.step_ratio_at(8)(rows).low > 1.15
    assert page.batch_sizes(rows) == [1, 8]
    assert measure.perplexity(rows[0]["metrics"], 0).value == pytest.approx(np.exp(0.5))
    assert measure.validity(rows[0]["metrics"]).value == pytest.approx(0.5)
