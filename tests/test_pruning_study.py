"""The pruning study: its sweep, two real points on a tiny model (a head group removed and
recovered, Wanda 2:4), and the page rendered from rows alone."""

import copy

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment
from decodelab.experiment import runner


@pytest.fixture(scope="module")
def study():
    from experiments import pruning

    return pruning


def test_the_sweep_recovers_only_the_trained_model():
    module = config_module("pruning")
    trained, pretrained = module.get_sweep(), module.get_sweep("smollm2-135m")
    assert len(trained) == 37 and len(pretrained) == 20
    assert {p.get("recovery_steps", 0) for p in pretrained} == {0}
    assert sum(p.get("recovery_steps", 0) > 0 for p in trained) == 18
    assert {"kind": "dense", "recovery_steps": 40} in trained  # the steps alone


TINY_OVERRIDES = {"model.d_model": 64, "model.n_layers": 2, "model.n_heads": 4,
                  "model.n_kv_heads": 2, "model.d_ff": 256, "model.max_seq_len": 128,
                  "train.steps": 4, "train.warmup_steps": 1, "num_windows": 2,
                  "calibration_windows": 2, "window_tokens": 32, "new_tokens": 4, "repeats": 2,
                  "recovery.steps": 2, "recovery.warmup_steps": 1, "recovery.batch_size": 2,
                  "recovery.seq_len": 32}


class _Context:
    def __init__(self, workdir):
        self.workdir, self.show_progress = workdir, False

    def status(self, text):
        del text


@pytest.fixture(scope="module")
def rows(study, tmp_path_factory):
    module = config_module("pruning")
    workdir = tmp_path_factory.mktemp("pruning")
    out = []
    for point in ({"kind": "heads", "fraction": 0.5, "recovery_steps": 2},
                  {"kind": "2:4", "method": "wanda"}, {"kind": "dense"}):
        config = experiment.apply_overrides(module.get_config(), {**TINY_OVERRIDES, **point})
        metrics = study.evaluate(config, _Context(workdir))
        # What the runner stores: numbers, lists of numbers, dicts of lists (else it raises).
        point = experiment.expand(config, [{}])[0]
        runner._check_metrics(metrics, point)
        out.append({"config": config.to_dict(), "metrics": metrics, "wall_time_s": 1.0})
    return out


def test_a_removed_and_recovered_head_group_row(study, rows):
    heads = rows[0]["metrics"]
    assert heads["label"] == "heads -50% (taylor) + 2 recovery steps"
    assert study.layers(heads["heads_kept"]).sum(axis=1).tolist() == [2, 2]
    assert len(heads["recovery_loss"]) == 2 and heads["sparsity"] == 0.0
    dense_params = rows[2]["metrics"]["params"]
    assert heads["params"] < dense_params
    assert len(heads["reference_reps_s_b1"]) == len(heads["reps_s_b8"]) == 2


def test_a_wanda_two_four_row_is_half_sparse(rows):
    row = rows[1]["metrics"]
    assert row["label"] == "wanda 2:4" and row["sparsity"] == 0.5
    assert row["params"] == rows[2]["metrics"]["params"]  # zeros are still stored
    assert row["kl_mean"] > 0 and rows[2]["metrics"]["kl_mean"] == 0


def test_the_page_renders_from_the_rows(study, rows, tmp_path):
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    full = [dict(experiment="pruning", config_hash=str(i), seed=0, sweep_index=i, overrides={},
                 start_time="2026-01-01T00:00:00+00:00", provenance=provenance, **row)
            for i, row in enumerate(rows)]
    written = study.report(full, tmp_path)
    page = (tmp_path / "pruning.md").read_text()
    assert tmp_path / "pruning_heads.png" not in written  # no 25% heads row here
    assert "| heads -50% (taylor) + 2 recovery steps |" in page
    assert "- Requested sparsity: every unstructured and N:M row holds it" in page
    assert "**No speed from zeros.**" in page


def test_the_neuron_target_is_read_against_its_weight_bytes_ceiling(study, rows, tmp_path):
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    dense = copy.deepcopy(rows[2])
    neurons = copy.deepcopy(rows[0])  # a removal row, relabelled as 25% of the hidden units
    neurons["config"].update(kind="neurons", fraction=0.25, recovery_steps=0)
    neurons["metrics"]["parameter_bytes"] = 0.8 * dense["metrics"]["parameter_bytes"]
    full = [dict(experiment="pruning", config_hash=str(i), seed=0, sweep_index=i, overrides={},
                 start_time="2026-01-01T00:00:00+00:00", provenance=provenance, **row)
            for i, row in enumerate([dense, neurons])]
    study.report(full, tmp_path)
    page = (tmp_path / "pruning.md").read_text()
    assert "- 25% of hidden units removed: decode at batch 1 " in page
    megabytes = [row["metrics"]["parameter_bytes"] / 1e6 for row in (dense, neurons)]
    assert (f"  Its ceiling: it removes 20.0% of the parameter bytes ({megabytes[0]:.1f} to "
            f"{megabytes[1]:.1f} MB), so a step bound by reading its weights gains at most "
            f"1.25x") in page


def test_a_pretrained_model_is_not_recovered(study, tmp_path):
    module = config_module("pruning")
    config = module.get_config("smollm2-135m")
    config.recovery_steps = 5
    with pytest.raises(ValueError, match="config.recovery_steps must be 0 for a pretrained model"):
        study.evaluate(config, _Context(tmp_path))
