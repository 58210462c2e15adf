"""Training over two processes (multi-host, on one machine): two local processes with 4 fake CPU
devices each join one 8-device runtime (jax.distributed, gloo collectives) and train the tiny
config through the cached pipeline (tests/multihost_checks.py); both end by themselves, agree,
and match a single-process, single-device run of the same configs. One device here: the
processes run in subprocesses (the device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "multihost_checks.py"
TIMEOUT_S = 600  # generous bound on a loaded 2-core machine; a hung collective fails, not hangs

TOKENIZER = dict(vocab_size=512, model_type="bpe")
MODEL = {**presets.model_section("tiny").to_dict(), "max_seq_len": 64}
# 8 rows: 4 per process (the data axis spans the processes), 2 steps, checkpointed at the end.
# A small learning rate: Adam's first steps move each parameter by about the learning rate times
# the sign of its gradient, so where a gradient is at rounding level, summing it in another order
# (over 8 devices instead of one) can move that parameter by up to twice the learning rate.
TRAIN = dict(steps=2, batch_size=8, seq_len=16, learning_rate=1e-4, warmup_steps=0,
             checkpoint_every=2, log_every=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_trained_alike(actual: np.ndarray, desired: np.ndarray, name: str) -> None:
    """Parameters of the same training summed over other devices: equal to 1e-5 but for the few
    whose gradient is at rounding level, which Adam may move the other way (see TRAIN): those stay
    within twice the learning rate per step, and are at most 0.1% of the tensor."""
    bound = 2 * TRAIN["learning_rate"] * TRAIN["steps"]
    np.testing.assert_allclose(actual, desired, rtol=0, atol=bound, err_msg=name)
    off = np.abs(np.asarray(actual) - np.asarray(desired)) > 1e-5
    assert off.mean() <= 1e-3, f"{name}: {off.sum()} of {off.size} parameters differ by > 1e-5"


def _flat_params(model) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    """The workdir the two processes trained in and what each printed."""
    workdir = tmp_path_factory.mktemp("multihost")
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    started = [subprocess.Popen([sys.executable, str(SCRIPT), address, "2", str(i), str(workdir)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    results = []
    for process in started:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in started:
                p.kill()
            stdout, stderr = process.communicate()
            pytest.fail(f"{process.args[2:]} did not finish in {TIMEOUT_S} s:\n{stderr[-3000:]}")
        assert process.returncode == 0, f"{process.args[2:]} failed:\n{stderr[-3000:]}"
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return {"workdir": workdir, "processes": results}


@pytest.fixture(scope="module")
def one_device(two_processes, tmp_path_factory) -> pipeline.TrainedModel:
    """The same configs trained by this process on one device (the tokenizer the processes
    trained copied in, so that only the model is trained again)."""
    workdir = tmp_path_factory.mktemp("one_device")
    shutil.copytree(two_processes["workdir"] / "tokenizers", workdir / "tokenizers")
    return pipeline.load_or_train(TOKENIZER, MODEL, TRAIN, workdir, progress=False)


@pytest.mark.slow
def test_two_processes_form_one_mesh_and_end_together(two_processes):
    for index, result in enumerate(two_processes["processes"]):
        assert (result["process"], result["devices"], result["local_devices"]) == (index, 8, 4)
        assert result["step"] == 2
        assert result["q_shard_shape"] == [64, 1, 16]  # [D, N, H]: 4 query heads over 4 devices


@pytest.mark.slow
def test_two_processes_train_like_one_device(two_processes, one_device):
    reference = _flat_params(one_device.model)
    losses = [entry["loss"] for entry in one_device.history]
    for index, result in enumerate(two_processes["processes"]):
        np.testing.assert_allclose(result["losses"], losses, rtol=0, atol=1e-5)
        with np.load(two_processes["workdir"] / f"process{index}.npz") as saved:
            assert sorted(saved.files) == sorted(reference)
            for name, value in reference.items():
                _assert_trained_alike(saved[name], value, name)


@pytest.mark.slow
def test_the_cache_entry_is_written_once_and_restores_on_one_device(two_processes, one_device):
    workdir = two_processes["workdir"]
    (entry,) = (workdir / "models").glob("*/")
    assert [h["step"] for h in json.loads((entry / "history.json").read_text())] == [1, 2]
    assert sorted(p.name for p in (workdir / "tokenizers").iterdir() if p.is_dir()) == [
        pipeline.tokenizer_key(TOKENIZER)]
    # The checkpoint both processes wrote is the finished model: loaded here, not retrained.
    loaded = pipeline.load_or_train(TOKENIZER, MODEL, TRAIN, workdir, progress=False)
    assert loaded.resumed_from == 2
    reference = _flat_params(one_device.model)
    for name, value in _flat_params(loaded.model).items():
        _assert_trained_alike(value, reference[name], name)
