"""decodelab.sharding: a model laid out on a device mesh decodes, serves and trains like one device.

The multi-device checks run in subprocesses on 8 fake CPU devices (tests/sharding_checks.py; the
device count is fixed when JAX starts and the rest of the suite keeps one device). They start
together and run side by side: one process decodes every position encoding with GQA and MHA on
every mesh, one runs the programs (generate, sampling, speculative decoding, the serving engine,
a training step, Orbax restore, bad input), and two processes with 4 devices each form one
8-device runtime through jax.distributed. Each prints its measurements as JSON; the tests below
assert on them. The rules table itself is tested here, on one device.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import socket
import subprocess
import sys

import jax
import pytest
from absl import flags
from flax import nnx
from jax.sharding import PartitionSpec as P

import decodelab as dl
from decodelab import sharding
from decodelab.measure import mesh_timing, sharding_plan

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "sharding_checks.py"
TIMEOUT_S = 600  # generous bound on a loaded 2-core machine; a hung collective fails, not hangs
MESHES = ["8x1", "1x8", "2x4", "4x2"]
POSITIONS = ["learned", "sinusoidal", "t5", "alibi", "rope", "nope"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(process: subprocess.Popen) -> dict:
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{process.args[2:]} did not finish in {TIMEOUT_S} s:\n{stderr[-3000:]}")
    assert process.returncode == 0, f"{process.args[2:]} failed:\n{stderr[-3000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checks() -> dict:
    """Every subprocess's JSON, the processes started together (they share the 2 cores)."""
    address = f"127.0.0.1:{_free_port()}"
    started = {
        "matrix": _start("matrix", *MESHES),
        "programs": _start("programs"),
        "process0": _start("process", address, "2", "0"),
        "process1": _start("process", address, "2", "1"),
    }
    return {name: _result(p) for name, p in started.items()}


# --- The rules table (one device) ----------------------------------------------------------------


def _fake_mesh(data: int, model: int):
    """A mesh of the given shape over abstract devices: enough to compute PartitionSpecs."""
    return jax.sharding.AbstractMesh((data, model), sharding.AXES)


@pytest.mark.parametrize("name,shape,expected", [
    ("blocks/0/attn/q/kernel", (64, 8, 8), P(None, "model", None)),
    ("blocks/0/attn/k/kernel", (64, 8, 8), P(None, "model", None)),
    ("blocks/0/attn/v/kernel", (64, 2, 8), P()),  # 2 KV heads on 4 devices: replicated
    ("blocks/1/attn/o/kernel", (8, 8, 64), P("model", None, None)),
    ("blocks/0/mlp/gate/kernel", (64, 256), P(None, "model")),
    ("blocks/0/mlp/down/kernel", (256, 64), P("model", None)),
    ("embed/embedding", (512, 64), P("model", None)),  # vocabulary split
    ("embed/embedding", (510, 64), P()),  # ... unless the axis does not divide it
    ("lm_head/kernel", (64, 512), P(None, "model")),
    ("blocks/0/attn_norm/scale", (64,), P()),  # no rule: replicated
    ("positions/relative_bias/embedding", (32, 8), P()),
])
def test_param_spec_follows_the_rules_table(name, shape, expected):
    assert sharding.param_spec(name, shape, _fake_mesh(2, 4)) == expected


def test_an_axis_of_size_one_splits_nothing():
    assert sharding.param_spec("blocks/0/attn/q/kernel", (64, 8, 8), _fake_mesh(8, 1)) == P()


def test_query_heads_the_model_axis_does_not_divide_are_an_error_naming_it():
    with pytest.raises(ValueError, match=r"mesh axis 'model' has size 4, which does not divide "
                                         r"dimension 1 \(size 6\) of blocks/0/attn/q/kernel"):
        sharding.param_spec("blocks/0/attn/q/kernel", (64, 6, 8), _fake_mesh(1, 4))


def test_the_cache_spec_is_derived_from_the_named_layout(tiny_config):
    mesh = _fake_mesh(2, 2)  # tiny_config has 2 KV heads
    assert sharding.cache_spec(tiny_config, mesh, 4) == P(None, "data", "model", None, None)
    assert sharding.cache_spec(tiny_config, mesh, 4, layout="LBSKH") == P(
        None, "data", None, "model", None)
    # 2 KV heads on 4 devices: K left to XLA (it splits K over pairs of devices)
    assert sharding.cache_spec(tiny_config, _fake_mesh(1, 4), 1) == P(
        None, None, P.UNCONSTRAINED, None, None)


def test_a_batch_the_data_axis_does_not_divide_is_an_error_naming_it():
    with pytest.raises(ValueError, match="mesh axis 'data' has size 2, which does not divide the "
                                         "batch size 3"):
        sharding.batch_axis(_fake_mesh(2, 1), 3)
    assert sharding.batch_axis(_fake_mesh(2, 1), 1) is None  # one row is replicated


def test_make_mesh_on_one_device(tiny_config):
    mesh = sharding.make_mesh()
    assert dict(mesh.shape) == {"data": 1, "model": 1}
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2
    model = sharding.shard(dl.Transformer(tiny_config, rngs=nnx.Rngs(0)), mesh)
    assert model.mesh is mesh


@pytest.mark.parametrize("kwargs,message", [
    (dict(data=0), "mesh axis 'data' must be a positive int, got 0"),
    (dict(model=2.0), "mesh axis 'model' must be a positive int, got 2.0"),
    (dict(data=2), r"mesh axes 'data'=2 x 'model'=1 need 2 devices, but 1 are available"),
])
def test_make_mesh_rejects_bad_axes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sharding.make_mesh(**kwargs)


def test_shard_rejects_what_is_not_a_model():
    with pytest.raises(ValueError, match="model must be a Transformer"):
        sharding.shard(object(), sharding.make_mesh())


@pytest.mark.parametrize("args,message", [
    (("localhost", 2, 0), "coordinator_address must be 'host:port'"),
    (("127.0.0.1:1234", 0, 0), "num_processes must be an int >= 1, got 0"),
    (("127.0.0.1:1234", 2, 2), r"process_id must be an int in \[0, num_processes=2\), got 2"),
])
def test_initialize_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        sharding.initialize(*args)


def test_the_multi_process_flags_default_to_one_process():
    values = flags.FlagValues()
    sharding.define_flags(values)
    sharding.define_flags(values)  # a second program module defining them again is harmless
    values(["program"])
    assert (values.coordinator_address, values.num_processes, values.process_id) == (None, 1, 0)
    sharding.initialize_from_flags(values)  # one process: nothing to join
    values(["program", "--num_processes=2"])
    with pytest.raises(ValueError, match="--num_processes=2 needs --coordinator_address"):
        sharding.initialize_from_flags(values)


# --- On 8 devices (subprocesses) -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("attention", ["gqa", "mha"])
@pytest.mark.parametrize("position", POSITIONS)
def test_greedy_tokens_and_logits_on_a_mesh_equal_one_device(checks, position, attention, mesh):
    result = checks["matrix"][f"{position}/{attention}/{mesh}"]
    assert result["tokens_equal"]
    assert result["max_logit_diff"] <= 1e-5


@pytest.mark.slow
def test_generate_on_a_mesh_equals_one_device(checks):
    result = checks["programs"]["generate/2x4"]
    assert result["tokens_equal"]
    assert result["max_logprob_diff"] <= 1e-5


@pytest.mark.slow
def test_sampled_tokens_on_a_mesh_equal_one_device_for_a_fixed_seed(checks):
    result = checks["programs"]["sampled"]
    assert result["tokens_equal"] and result["distinct_from_greedy"]
    assert result["max_logprob_diff"] <= 1e-5


@pytest.mark.slow
def test_the_decode_step_gathers_no_parameter_and_no_cache(checks):
    programs = checks["programs"]
    # 2 KV heads on a model axis of 4: rows over data; K is left to XLA, which splits it over the
    # pairs of devices whose query heads share a KV head (the prefill returns it replicated)
    assert programs["cache_sharding"] == str(P(None, "data"))
    gathers = programs["decode_all_gathers"]
    for shape in gathers["step"]:
        assert shape not in programs["param_shapes"]
        assert len(shape) < 5, f"the decode step all-gathers a cache {shape}"
    # nothing larger than the logits [B, V] (split over the vocabulary, gathered to sample) but,
    # under the cond that runs it only for a row with Mirostat v1, its Zipf estimate's pairs of
    # the logits and their places among the top 100 ([B, V, 2])
    assert max(math.prod(shape) for shape in gathers["step"]) <= 2 * 8 * 512
    # once per call, after the loop: the cache back to the layout the prefill gave it
    L, B, K, S, H = programs["cache_shape"]
    assert all(shape == [L, B // 2, K, S, H] for shape in gathers["entry"])


@pytest.mark.slow
def test_speculative_decoding_and_the_engine_on_a_mesh_equal_one_device(checks):
    programs = checks["programs"]
    assert programs["speculative"]["tokens_equal"]
    assert programs["engine"] == {"tokens_equal": True, "requests": 8}


@pytest.mark.slow
def test_beam_search_on_a_mesh_equals_one_device(checks):
    result = checks["programs"]["beam"]
    assert result["tokens_equal"]
    assert result["max_score_diff"] <= 1e-5


@pytest.mark.slow
def test_a_training_step_on_a_mesh_equals_one_device(checks):
    result = checks["programs"]["train"]
    assert result["loss_diff"] <= 1e-5
    assert result["max_param_change"] >= 1e-4  # the step did move the parameters
    assert result["max_param_diff"] <= 1e-5
    assert result["q_sharding"] == str(P(None, "model", None))  # query heads split


@pytest.mark.slow
@pytest.mark.parametrize("mesh,shape", [("4x2", {"data": 4, "model": 2}),
                                        ("1x8", {"data": 1, "model": 8})])
def test_a_checkpoint_saved_from_one_mesh_restores_onto_another(checks, mesh, shape):
    result = checks["programs"][f"restore/{mesh}"]
    assert result == {"equal": True, "q_sharding": str(P(None, "model", None)), "mesh": shape}


@pytest.mark.slow
def test_a_sharded_model_resharded_or_quantized_is_on_the_mesh_asked(checks):
    got = checks["programs"]["transforms"]
    assert got["reshard_mesh"] == got["reshard_q_mesh"] == {"data": 4, "model": 2}
    assert got["reshard_q"] == str(P(None, "model", None)) and got["reshard_equal"]
    assert got["quantized_mesh"] == {"data": 2, "model": 4}
    assert got["quantized_leaf_meshes"] == [str({"data": 2, "model": 4})]
    assert got["warnings"] == [
        "shard: 14 matrices of the blocks match no rule and are replicated over the 'model' axis "
        "(size 4), e.g. blocks/0/attn/k/qvalue, blocks/0/attn/k/scale, blocks/0/attn/o/qvalue; "
        "the rules split float kernels, so a quantized model's projections are held whole by "
        "every device"]


def test_bad_meshes_are_errors_naming_the_axis(checks):
    errors = checks["programs"]["errors"]
    assert errors["mesh_too_large"] == ("mesh axes 'data'=4 x 'model'=4 need 16 devices, but 8 "
                                        "are available")
    # 4 query heads on a model axis of 8 (the first parameter that splits them reports it)
    assert re.fullmatch(r"mesh axis 'model' has size 8, which does not divide dimension \d "
                        r"\(size 4\) of blocks/0/attn/[qo]/kernel .*", errors["heads"])


@pytest.mark.slow
@pytest.mark.parametrize("batch", [2, 6])
def test_a_batch_the_data_axis_does_not_divide_is_padded_and_equals_one_device(checks, batch):
    """On a data axis of 4, 2 and 6 prompts run as 4 and 8 rows; the padding rows are never
    returned, and every decoder gives one device's tokens (a sampled row r draws as row r of a
    batch of 8: the padding changes no row's key)."""
    result = checks["programs"]["padded"][f"batch {batch}"]
    assert result == {"shape": [batch, 6], "generate": True, "sampled": True,
                      "speculative": True, "beam": True, "beam_shape": [batch, 2, 6]}


@pytest.mark.slow
def test_an_engine_of_6_slots_on_a_data_axis_of_4_serves_like_one_device(checks):
    assert checks["programs"]["padded"]["engine"] == {"slots": 6, "rows": 8,
                                                      "tokens_equal": True}


@pytest.mark.slow
def test_two_processes_generate_on_one_mesh_like_one_device(checks):
    for process in (0, 1):
        result = checks[f"process{process}"]
        assert (result["process"], result["devices"], result["local_devices"]) == (process, 8, 4)
        assert result["tokens"] == checks["programs"]["reference_tokens"]


# --- The plan and the timing of results/sharding.md -----------------------------------------------


def test_the_plan_counts_one_layers_bytes(tiny_config):
    # D 64, N 4, K 2, H 16, F 256, SwiGLU: q and o 64 x 4 x 16 each, k and v 64 x 2 x 16 each,
    # gate, up and down 64 x 256 each; bf16.
    step = sharding_plan.layer_step(tiny_config, batch=2, context=10, model=8)
    assert step.weight_bytes == (2 * 4096 + 2 * 2048 + 3 * 16384) * 2
    assert step.kv_bytes == 2 * 2 * 10 * 2 * 16 * 2  # k and v, B, S, K, H, bytes
    assert step.allreduce_bytes == 2 * 2 * 64 * 2  # two all-reduces of B x D
    assert step.link_bytes == 2 * 7 * 512 // 8  # a ring sends 2 (M - 1) / M of the payload
    assert not step.kv_split  # 2 KV heads on 8 devices


def test_the_plan_break_even_batch_solves_tp_equals_dp():
    chip = sharding_plan.CHIPS[0]
    batch = sharding_plan.break_even_batch(sharding_plan.LLAMA3_8B, chip, 2048)
    tp = sharding_plan.tp_seconds(sharding_plan.LLAMA3_8B, chip, batch, 2048,
                                  sharding_plan.DEVICES)
    dp = sharding_plan.dp_seconds(sharding_plan.LLAMA3_8B, chip, batch, 2048)
    assert abs(tp - dp) <= 1e-6 * dp


def test_mesh_timing_times_a_mesh_and_digests_its_tokens(tiny_config):
    model = dl.Transformer(tiny_config, rngs=nnx.Rngs(0))
    alone = mesh_timing.time_mesh(model, [[1, 2, 3], [4, 5]], 2, 2, None)
    meshed = mesh_timing.time_mesh(model, [[1, 2, 3], [4, 5]], 2, 1, (1, 1))
    assert (alone.shape, meshed.shape, len(alone.rep_s), len(meshed.rep_s)) == (None, (1, 1), 2, 1)
    assert alone.tokens_sha256 == meshed.tokens_sha256 and alone.median_s > 0
    out = dl.generate(model, [[1, 2, 3], [4, 5]], dl.SamplingParams.greedy(), 2)
    assert alone.tokens_sha256 == mesh_timing.tokens_digest(out.tokens)
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        mesh_timing.time_mesh(model, [[1, 2, 3]], 2, 0, None)


def test_the_sharding_program_refuses_a_positional_argument():
    done = subprocess.run([sys.executable, "-m", "experiments.sharding", "results/sharding.md"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0
    assert "this program takes flags only (--name=value), got the positional argument(s) " \
           "['results/sharding.md']" in done.stderr
