"""The sharding study: its sweep, the plan's rows against the published figures, bad points
refused by name, the page in the one form from synthetic rows, and the tiny study run end to end
by its own program (which asks for the 8 fake CPU devices before JAX starts: a subprocess, since
this process's device count is fixed)."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest
from study_config import config_module, synthetic_row

from decodelab import experiment, report
from decodelab.measure import mesh_timing, sharding_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
H100, V5E = (chip.name for chip in sharding_plan.CHIPS)


@pytest.fixture(scope="module")
def study():
    from experiments import sharding

    return sharding


def points(arg=None):
    module = config_module("sharding")
    return experiment.expand(module.get_config(arg), module.get_sweep(arg))


def config(**overrides):
    return experiment.apply_overrides(config_module("sharding").get_config(), overrides)


def test_the_sweep_plans_each_chip_model_and_batch_and_measures_each_mesh():
    configs = [p.config for p in points()]
    plan = {(c.chip, c.plan_model, c.batch) for c in configs if c.part == "plan"}
    assert len(plan) == 2 * 3 * 5 and (V5E, "smollm2-135m", 2048) in plan
    assert [c.mesh for c in configs if c.part == "measure"] == ["none", "8x1", "1x8", "2x4", "4x2"]
    assert all(c.repeats == 3 and c.model.d_model == 256 for c in configs)


def test_a_plan_row_holds_the_published_figures_it_used(study):
    m = study.evaluate(config(part="plan", chip=V5E, plan_model="llama3-8b-shape", batch=1), None)
    # Llama-3-8B's 32 heads split over 8 chips; its 16.1 GB of bf16 weights do not fit a v5e's 16.
    assert (round(m["tp_us"], 2), round(m["dp_us"], 2)) == (78.14, 533.89)
    assert (m["faster"], m["dp_fits"], round(m["break_even_batch"])) == (
        "TP (DP does not fit)", False, 1591)
    assert (m["hbm_tb_s"], m["link_gb_s"], m["hbm_gb"], m["allreduce_latency_us"]) == (
        0.819, 100.0, 16.0, 5.0)
    assert m["source"] == sharding_plan.CHIPS[1].source


def test_bad_points_are_refused_by_name(study):
    for change, message in ((dict(part="both"), "part must be one of"),
                            (dict(part="plan", plan_model="gpt"), "plan_model must be one of"),
                            (dict(part="plan", chip="TPU v4"), "chip must be one of"),
                            (dict(part="plan", batch=0), "batch must be an int >= 1, got 0"),
                            (dict(mesh="8"), "mesh must be 'none' or 'DxM'"),
                            (dict(repeats=0), "repeats must be an int >= 1")):
        with pytest.raises(ValueError, match=message):
            study.evaluate(config(**change), None)
    with pytest.raises(ValueError, match="mesh axes 'data'=4 x 'model'=4 need 16 devices"):
        mesh_timing.time_mesh(None, [[1]], 1, 1, (4, 4))


def synthetic_rows(study) -> list[dict]:
    """The tiny sweep's rows: plan rows as the study computes them, measured rows with known
    times (every mesh twice one device's, 1 x 8 1.5 times) and the 2 x 4 mesh's tokens differing."""
    rows = []
    for p in points("tiny"):
        c = p.config
        if c.part == "plan":
            metrics = study.evaluate(c, None)
        else:
            f = {"none": 1.0, "1x8": 1.5}.get(c.mesh, 2.0)
            metrics = {"first_s": 3.0, "compile_s": 2.9, "rep_s": [0.1 * f, 0.11 * f, 0.09 * f],
                       "median_ms": 100 * f, "ms_per_token": 25 * f, "params_m": 0.1,
                       "tokens_sha256": "b" if c.mesh == "2x4" else "a", "load_average": 1.0}
        rows.append(synthetic_row("sharding", p, metrics))
    return rows


def test_the_claims_and_page_from_synthetic_rows(study, tmp_path):
    rows = synthetic_rows(study)
    tokens, fastest, h100, v5e, fits, medium_h100, medium_v5e = (
        claim.judge(rows) for claim in study.CLAIMS)
    assert tokens.measured == 0.75 and tokens.verdict.side == -1
    assert fastest.measured.value == pytest.approx(1.5) and fastest.verdict.text == "met"
    assert (round(h100.measured), round(v5e.measured)) == (1631, 1591) and h100.met and v5e.met
    # bf16 weights plus one of 8 replicas' cache at B = 1: 32 layers of K and V, 2,048 x 8 x 128.
    weights = sharding_plan.LLAMA3_8B.num_params() * 2
    assert fits.measured == pytest.approx((weights + 32 * 2 * 2048 * 8 * 128 * 2 / 8) / 1e9)
    assert fits.met
    assert medium_h100.measured == medium_v5e.measured == 0 and medium_h100.met
    done = report.render(study.forms(rows)[0], rows, tmp_path)
    page = done.page.read_text()
    assert page.startswith("# When does tensor parallel decoding pay over 8 chips, and does "
                           "every mesh decode like one device?\n\nOn paper TP over 8 chips beats "
                           "DP for the Llama-3-8B shape below a total batch of 1,630 (H100)")
    assert "only 0.750 of the meshes gave one device's greedy tokens" in page
    assert "| 2 x 4 | 2.90 | 200 | 50.0 | 2.00 [" in page and "| NO |" in page
    assert len(study.sh.main_table(rows).columns) <= report.form.MAX_COLUMNS
    assert "then `python -m experiments.report --all` (this page)" in page
    assert sorted(p.name for p in done.written) == [
        "sharding.csv", "sharding.md", "sharding.png", "sharding_break_even.csv",
        "sharding_plan_bytes.csv", "sharding_plan_times.csv", "sharding_points.csv",
        "sharding_tp_layer.csv"]


def test_fake_cpu_devices_refuses_a_backend_already_started(monkeypatch):
    jax.device_count()  # the backend starts here if no test before started it
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    monkeypatch.delenv("NPROC", raising=False)
    with pytest.raises(ValueError, match="count=64 devices need XLA_FLAGS="):
        mesh_timing.fake_cpu_devices(64)
    assert os.environ["XLA_FLAGS"].split() == ["--xla_backend_optimization_level=0",
                                               "--xla_force_host_platform_device_count=64"]
    # Four pool threads per device, so that waiting collectives cannot hold them all.
    assert os.environ["NPROC"] == "256"


def test_fake_cpu_environment_keeps_a_larger_thread_pool_and_replaces_the_device_count(
        monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_ftz")
    for before, after in (("1000", "1000"), ("8", "32"), ("", "32"), ("many", "32")):
        monkeypatch.setenv("NPROC", before)
        mesh_timing.fake_cpu_environment(8)
        assert os.environ["NPROC"] == after
    assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_ftz",
                                               "--xla_force_host_platform_device_count=8"]
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        mesh_timing.fake_cpu_environment(0)


@pytest.mark.slow
def test_the_tiny_study_runs_on_8_fake_devices_and_renders(study, tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "experiments.sharding",
                           "--config=configs/sharding.py:tiny", f"--workdir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = report.load_rows(tmp_path)
    measured = {r["config"]["mesh"]: r["metrics"] for r in rows if r["config"]["part"] == "measure"}
    assert list(measured) == ["none", "8x1", "1x8", "2x4", "4x2"]
    assert len({m["tokens_sha256"] for m in measured.values()}) == 1
    assert all(len(m["rep_s"]) == 1 for m in measured.values())
    assert {r["provenance"]["device_count"] for r in rows} == {8}
    judged = report.render(study.forms(rows)[0], rows, tmp_path / "page").judged
    assert len(judged) == 7 and judged[0].met
