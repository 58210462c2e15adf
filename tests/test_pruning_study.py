"""The pruning study: its sweep, three real points on a tiny model (a head group removed and
recovered, Wanda 2:4, dense) run by the runner, and the pages in the one form rendered from rows
alone (the real rows, and copies of them relabelled as the points a page's targets read)."""

import copy

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment, report
from decodelab.measure.compression import layers


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


class Context:
    def __init__(self, workdir):
        self.workdir, self.show_progress = workdir, False

    def status(self, text):
        del text


@pytest.fixture(scope="module")
def rows(study, tmp_path_factory):
    """The runner's rows (it checks what a row may hold: numbers, lists, dicts of lists)."""
    config = experiment.apply_overrides(config_module("pruning").get_config(), TINY_OVERRIDES)
    sweep = [{"kind": "heads", "fraction": 0.5, "recovery_steps": 2},
             {"kind": "2:4", "method": "wanda"}, {"kind": "dense"}]
    return experiment.run(config, sweep, study.evaluate, tmp_path_factory.mktemp("pruning"),
                          progress=False)


def render(study, rows, out_dir) -> dict[str, report.Rendered]:
    """Every page of ``rows``: page name -> what was rendered."""
    return {form.name: report.render(form, rows, out_dir) for form in study.forms(rows)}


def relabelled(row, index, **config):
    """A copy of ``row`` as the point ``config`` names (sweep index ``index``)."""
    out = copy.deepcopy(row)
    out["config"].update(config)
    out.update(sweep_index=index, config_hash=f"relabelled{index}")
    return out


def test_a_removed_and_recovered_head_group_row(rows):
    heads = rows[0]["metrics"]
    assert heads["label"] == "heads -50% (taylor) + 2 recovery steps"
    assert layers(heads["heads_kept"]).sum(axis=1).tolist() == [2, 2]
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
    done = render(study, rows, tmp_path)["pruning"]
    page = done.page.read_text()
    assert page.startswith("# How much of a model 64 wide with 2 layers")
    assert "| heads -50% (taylor) + 2 recovery steps |" in page
    assert ("| requested sparsity: largest miss over the unstructured and N:M rows | 0 | "
            "<= 0.00100 | met (point estimate, no interval) |") in page
    assert "| the study's points: minutes in all |" in page
    assert "- No speed from zeros: unstructured and N:M rows keep their zeros" in page
    # No 25% heads row here, so no heads CSV; every figure is in the scoreboard CSV.
    assert sorted(p.name for p in done.written if p.suffix == ".csv") == [
        "pruning.csv", "pruning_scoreboard.csv"]


def test_the_neuron_target_is_read_against_its_weight_bytes_ceiling(study, rows, tmp_path):
    dense = rows[2]
    neurons = relabelled(rows[0], 1, kind="neurons", fraction=0.25, recovery_steps=0)
    neurons["metrics"]["parameter_bytes"] = 0.8 * dense["metrics"]["parameter_bytes"]
    page = render(study, [dense, neurons], tmp_path)["pruning"].page.read_text()
    assert ("| 25% of hidden units removed: its weight-bytes ceiling (dense bytes / its bytes) | "
            "1.25x | >= 1.15x | met (point estimate, no interval) |") in page
    assert "| 25% of hidden units removed: speed-up at batch 1 |" in page
    megabytes = [row["metrics"]["parameter_bytes"] / 1e6 for row in (dense, neurons)]
    assert (f"removes 20.0% of the parameter bytes ({megabytes[0]:.1f} to {megabytes[1]:.1f} "
            "MB): a step bound by reading its weights gains at most 1.25x") in page


def test_wanda_and_recovery_are_judged_window_by_window(study, rows, tmp_path):
    dense, wanda = rows[2], rows[1]
    magnitude = relabelled(wanda, 3, method="magnitude")
    magnitude["metrics"]["kl_per_window"] = [k + 0.01 for k in wanda["metrics"]["kl_per_window"]]
    recovered = relabelled(wanda, 4, recovery_steps=2)
    recovered["metrics"]["kl_per_window"] = [k + 0.02 for k in wanda["metrics"]["kl_per_window"]]
    page = render(study, [dense, wanda, magnitude, recovered], tmp_path)["pruning"]
    text = page.page.read_text()
    assert ("| Wanda minus magnitude, mean KLD (no recovery): 2:4 | -0.0100 [-0.0100, -0.0100] | "
            "<= 0 | met |") in text
    assert ("| recovered minus not recovered, mean KLD: wanda 2:4 | 0.0200 [0.0200, 0.0200] | "
            "<= 0 | not met |") in text
    assert "Wanda minus magnitude, mean KLD (no recovery): met on 1 of 6 (5 undecided or not " \
           "measured)" in text.splitlines()[2]


def test_the_heads_csv_marks_the_groups_each_layer_lost(study, rows, tmp_path):
    heads = relabelled(rows[0], 1, fraction=0.25, recovery_steps=0)
    done = render(study, [rows[2], heads], tmp_path)["pruning"]
    body = (tmp_path / "pruning_heads.csv").read_text().splitlines()
    assert body[0] == "layer,key/value head group,importance,rank (0 the top),removed"
    removed = [line.split(",")[-1] for line in body[1:]]
    kept = layers(heads["metrics"]["heads_kept"]).astype(bool)  # [L, N], 2 query heads a group
    assert removed == ["no" if k else "yes" for k in kept[:, ::2].reshape(-1)]
    assert "Which heads go first (heads -50% (taylor) + 2 recovery steps, the heads CSV)" in \
        done.page.read_text()
    assert np.asarray(layers(heads["metrics"]["head_importance"])).shape == (2, 2)


def test_each_reference_model_gets_its_own_page(study, rows, tmp_path):
    pretrained = [relabelled(row, 10 + i, model={**row["config"]["model"],
                                                 "pretrained": "smollm2-135m"})
                  for i, row in enumerate(rows[1:])]
    pages = render(study, list(rows) + pretrained, tmp_path)
    assert sorted(pages) == ["pruning", "pruning_smollm2-135m"]
    text = pages["pruning_smollm2-135m"].page.read_text()
    assert text.startswith("# How much of the pretrained `smollm2-135m`")
    assert "heads -50%" not in text.split("## Method")[0]  # the trained model's row


def test_a_pretrained_model_is_not_recovered(study, tmp_path):
    module = config_module("pruning")
    config = module.get_config("smollm2-135m")
    config.recovery_steps = 5
    with pytest.raises(ValueError, match="config.recovery_steps must be 0 for a pretrained model"):
        study.evaluate(config, Context(tmp_path))
