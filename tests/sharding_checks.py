"""Checks of decodelab.sharding on fake CPU devices, run by tests/test_sharding.py in subprocesses
(the device count is fixed when JAX starts, and the rest of the suite keeps one device).

    PYTHONPATH=. python tests/sharding_checks.py matrix 8x1 1x8  # encodings x attention x meshes
    PYTHONPATH=. python tests/sharding_checks.py programs  # generate, speculative, engine, ...
    PYTHONPATH=. python tests/sharding_checks.py process ADDRESS NUM_PROCESSES PROCESS_ID

Each prints one JSON object on its last line: the measured values the tests assert on.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import warnings

from xla_flags import set_xla_flags  # tests/, the script's folder

MODE = sys.argv[1]
DEVICES = 4 if MODE == "process" else 8
# The suite's XLA flags (xla_flags.py: cheaper compiles) and the fake devices with a thread pool
# that their collectives cannot exhaust (fake_cpu_environment); the environment's flags are
# dropped.
set_xla_flags(keep_environment=False)
from decodelab.measure.mesh_timing import fake_cpu_environment  # noqa: E402

fake_cpu_environment(DEVICES)

import jax  # noqa: E402  (after XLA_FLAGS)

jax.config.update("jax_numpy_rank_promotion", "raise")
if MODE == "process":
    from decodelab import sharding as _sharding  # noqa: E402

    _sharding.initialize(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import decodelab as dl  # noqa: E402
from decodelab import sampling, sharding  # noqa: E402
from decodelab.cache.dense import KVCache  # noqa: E402
from decodelab.decode import caches
from decodelab.decode import generation as decode
from decodelab.decode import request, shapes
from decodelab.serving import Request, SlotEngine  # noqa: E402
from decodelab.text import data
from decodelab.train import checkpoint  # noqa: E402
from decodelab.train import trainer as train  # noqa: E402

MESHES = [(8, 1), (1, 8), (2, 4), (4, 2)]
POSITIONS = ["learned", "sinusoidal", "t5", "alibi", "rope", "nope"]
# 8 query heads so that every mesh axis splits them; GQA's 2 KV heads split over a model axis of 2
# and are replicated over 4 and 8, MHA's 8 split over every model axis.
ATTENTION = {"gqa": 2, "mha": 8}
B, STEPS = 8, 6


MAX_LEN_32 = dl.DecodeOptions(max_len=32)  # generate's cache slots per row


def config(position: str = "rope", kv_heads: int = 2, **changes) -> dl.ModelConfig:
    # One layer: what sharding changes (heads split under a bias, rotations, added tables, the
    # cache, the all-reduces back into the residual stream) is all in one layer, and each layer
    # adds compile time to every check.
    fields = dict(vocab_size=512, d_model=64, n_layers=1, n_heads=8, n_kv_heads=kv_heads,
                  d_ff=256, max_seq_len=64, position=position)
    return dl.ModelConfig(**{**fields, **changes})


def model_of(cfg: dl.ModelConfig, seed: int = 0) -> dl.Transformer:
    return dl.Transformer(cfg, rngs=nnx.Rngs(seed))


def prompts(count: int = B, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 512, int(n)).tolist() for n in rng.integers(2, 12, count)]


def greedy_through_cache(models: list[dl.Transformer], steps: int = STEPS):
    """For each model: tokens ``[B, steps]`` and logits ``[B, steps, V]`` of a greedy continuation
    computed with the model and its cache directly (ragged prefill, then one token at a time).
    All models run in one compiled program (one compile per mesh, not one per model)."""
    rows = prompts()
    block = np.zeros((B, 16), np.int32)
    for i, r in enumerate(rows):
        block[i, :len(r)] = r
    lengths = np.asarray([len(r) for r in rows], np.int32)
    graphdefs, weights = zip(*(nnx.split(m) for m in models))

    def decode(graphdef, weights, block, lengths):
        m = nnx.merge(graphdef, weights)
        cache = KVCache.init(m.config, batch_size=B, max_len=32)
        logits, cache = m(block, cache=cache, num_valid=lengths)
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]

        def step(carry, _):
            last, cache = carry
            token = jnp.argmax(last, axis=-1).astype(jnp.int32)  # [B]
            logits, cache = m(token[:, None], cache=cache)
            return (logits[:, 0], cache), (token, last)

        _, (tokens, all_logits) = jax.lax.scan(step, (last, cache), length=steps)
        return tokens.T, all_logits.transpose(1, 0, 2)  # [B, steps], [B, steps, V]

    @jax.jit
    def run(weights, block, lengths):
        return [decode(g, w, block, lengths) for g, w in zip(graphdefs, weights)]

    return [(np.asarray(t), np.asarray(x)) for t, x in run(list(weights), block, lengths)]


def matrix(meshes: list[tuple[int, int]]) -> dict:
    """Every (position encoding, attention) on each of ``meshes`` against one device."""
    cases = [(p, a) for p in POSITIONS for a in ATTENTION]
    models = [model_of(config(p, ATTENTION[a])) for p, a in cases]
    refs = greedy_through_cache(models)
    out = {}
    for mesh in meshes:
        sharded = [sharding.shard(m, sharding.make_mesh(*mesh)) for m in models]
        for (position, attention), (tokens, logits), (ref_tokens, ref_logits) in zip(
                cases, greedy_through_cache(sharded), refs):
            out[f"{position}/{attention}/{mesh[0]}x{mesh[1]}"] = {
                "tokens_equal": bool((tokens == ref_tokens).all()),
                "max_logit_diff": float(np.abs(logits - ref_logits).max()),
            }
    return out


class Lap:
    """``lap(name)`` reports on stderr the CPU seconds since the previous lap (where a slow check
    shows up)."""

    def __init__(self):
        self.last = time.process_time()

    def __call__(self, name: str) -> None:
        now = time.process_time()
        print(f"{name}: {now - self.last:.1f} s CPU", file=sys.stderr, flush=True)
        self.last = now


def error_message(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def all_gathers(text: str) -> dict[str, list[list[int]]]:
    """The result shapes of the all-gathers in compiled HLO text: those of the program's entry
    (run once per call) and those of the computations it calls (the loop body: every step)."""
    found: dict[str, list[list[int]]] = {"entry": [], "step": []}
    where = "step"
    for line in text.splitlines():
        if not line.startswith(" ") and line.endswith("{"):
            where = "entry" if line.startswith("ENTRY") else "step"
        if "all-gather(" in line or "all-gather-start(" in line:
            shape = re.search(r"=\s*\(?[a-z0-9]+\[([0-9,]*)\]", line).group(1)
            found[where].append([int(d) for d in shape.split(",") if d])
    return found


def programs() -> dict:
    out: dict = {}
    lap = Lap()
    rows = prompts()
    greedy = dl.SamplingParams.greedy()
    sampled = dl.SamplingParams(temperature=0.9, top_p=0.9, top_k=50)
    model = model_of(config("rope", 2))
    ref = dl.generate(model, rows, greedy, STEPS, options=MAX_LEN_32)
    out["reference_tokens"] = ref.tokens.tolist()
    smodel = sharding.shard(model, sharding.make_mesh(2, 4))

    lap("reference")
    # generate: greedy, and sampled with a fixed seed (the model-only mesh 1 x 8 is the
    # two-process check's; every mesh decodes in matrix())
    got = dl.generate(smodel, rows, greedy, STEPS, options=MAX_LEN_32)
    out["generate/2x4"] = {"tokens_equal": bool((got.tokens == ref.tokens).all()),
                           "max_logprob_diff": float(np.abs(got.logprobs - ref.logprobs).max())}
    lap("generate on a mesh")
    # (the compiled programs are reused: sampling parameters and seeds are array values)
    ref_sampled = dl.generate(model, rows, sampled, STEPS, seed=7, options=MAX_LEN_32)
    got = dl.generate(smodel, rows, sampled, STEPS, seed=7, options=MAX_LEN_32)
    out["sampled"] = {"tokens_equal": bool((got.tokens == ref_sampled.tokens).all()),
                      "distinct_from_greedy": bool((got.tokens != ref.tokens).any()),
                      "max_logprob_diff": float(np.abs(got.logprobs - ref_sampled.logprobs).max())}

    lap("sampled")
    # the cache and the decode loop's parameters stay sharded: no all-gather of their size
    graphdef, weights = nnx.split(smodel)
    block, lengths = shapes.prompt_block([np.asarray(r, np.int32) for r in rows],
                                         shapes.Shapes(rows=B, padded_rows=B, columns=STEPS,
                                                       max_len=32))
    inputs = request.RowInputs(prompt_lengths=lengths, keys=sampling.batch_keys(0, B),
                               params=greedy.per_row(B, 512), eos_mask=np.zeros((512,), bool),
                               stop_ids=np.full((0, 1), -1, np.int32))
    cache = caches.new_cache(weights, graphdef=graphdef, batch_size=B, max_len=32, kind=None)
    state = decode.prefill(weights, block, inputs, cache, graphdef=graphdef,
                           outputs=request.OutputSpec(STEPS))
    out["cache_sharding"] = str(state.cache.k.sharding.spec)
    text = decode.DECODE_LOOP.loop.lower(weights, state, graphdef=graphdef).compile().as_text()
    out["decode_all_gathers"] = all_gathers(text)
    out["param_shapes"] = [list(x.shape) for x in jax.tree.leaves(weights) if x.ndim > 1]
    out["cache_shape"] = list(state.cache.k.shape)

    lap("decode loop text")
    # speculative decoding with a sharded target and draft; greedy, so equal to generate's tokens
    draft = sharding.shard(model_of(config("rope", 2, d_ff=128), seed=1),
                           sharding.make_mesh(2, 4))
    got = dl.speculative_generate(smodel, draft, rows, greedy, 3, STEPS, seed=0)
    out["speculative"] = {"tokens_equal": bool((got.tokens == ref.tokens).all())}

    lap("speculative")
    # serving engine: 4 slots over the data axis, the waiting prompts prefilled together
    requests = [Request(id=i, prompt=tuple(r), max_new_tokens=STEPS) for i, r in enumerate(rows)]
    done = SlotEngine(smodel, num_slots=4, max_len=32).run(requests, n=4)
    out["engine"] = {"tokens_equal": all(done[i].tokens == ref.tokens[i].tolist()
                                         for i in range(B)), "requests": len(done)}

    lap("engine")
    # beam search: 4 prompts x 2 beams, rows copied between beams every step
    ref_beam = dl.beam_search(model, rows[:4], 2, STEPS, max_len=32)
    got = dl.beam_search(smodel, rows[:4], 2, STEPS, max_len=32)
    out["beam"] = {"tokens_equal": bool((got.tokens == ref_beam.tokens).all()),
                   "max_score_diff": float(np.abs(got.scores - ref_beam.scores).max())}
    lap("beam")
    out["padded"] = padded(model, rows, ref, (sampled, ref_sampled))
    lap("padded batches")
    # one training step, data and tensor parallel
    # Plain gradient descent: the update is the gradient times 0.1, so comparing parameters
    # compares the partitioned gradients (Adam's first step moves each parameter by about +-lr
    # whatever its gradient's size, which turns rounding-level differences into lr-sized ones).
    tx = optax.sgd(0.1)
    batch = np.random.default_rng(0).integers(0, 512, (8, 17)).astype(np.int32)
    results = []
    before = jax.tree.leaves(jax.device_get(nnx.split(model)[1]))
    for m in (model, smodel):
        graphdef, params = nnx.split(m)
        params = jax.tree.map(jnp.copy, params)  # the step donates its input
        step = train.make_train_step(graphdef, tx)
        params, _, metrics = step(params, tx.init(params), batch, None)
        results.append((float(metrics["loss"]), jax.tree.leaves(jax.device_get(params))))
    (loss, params), (sloss, sparams) = results
    out["train"] = {"loss": loss, "loss_diff": abs(loss - sloss),
                    "max_param_diff": max(float(np.abs(a - b).max())
                                          for a, b in zip(params, sparams)),
                    "max_param_change": max(float(np.abs(a - b).max())
                                            for a, b in zip(params, before)),
                    "q_sharding": str(smodel.blocks[0].attn.q.kernel[...].sharding.spec)}

    lap("train")
    # Orbax: saved from a (2, 4) mesh, restored onto (4, 2) and onto (1, 8)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(data.split_documents("train")["hamlet"])
        # a checkpoint embeds a tokenizer of the model's vocabulary
        tokenizer = dl.Tokenizer.train([corpus], vocab_size=model.config.vocab_size)
        dl.save_checkpoint(os.path.join(tmp, "ckpt"), smodel, tokenizer)
        ref_leaves = jax.tree.leaves(jax.device_get(nnx.state(model)))
        for mesh in [(4, 2), (1, 8)]:
            restored = checkpoint.load_sharded(os.path.join(tmp, "ckpt"),
                                             sharding.make_mesh(*mesh))
            leaves = jax.tree.leaves(nnx.state(restored))
            out[f"restore/{mesh[0]}x{mesh[1]}"] = {
                "equal": all(np.array_equal(a, np.asarray(b)) for a, b in zip(ref_leaves, leaves)),
                "q_sharding": str(restored.blocks[0].attn.q.kernel[...].sharding.spec),
                "mesh": dict(restored.mesh.shape)}

    lap("orbax")
    # transforms compose with shard: a sharded model re-laid out on another mesh moves there;
    # quantize keeps the mesh and warns that the model axis holds its projections whole
    resharded = sharding.shard(smodel, sharding.make_mesh(4, 2))
    q_kernel = resharded.blocks[0].attn.q.kernel[...]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = dl.quantize(smodel, weights="int8")
    out["transforms"] = {
        "reshard_mesh": dict(resharded.mesh.shape), "reshard_q": str(q_kernel.sharding.spec),
        "reshard_q_mesh": dict(q_kernel.sharding.mesh.shape),
        "reshard_equal": bool(np.array_equal(q_kernel, model.blocks[0].attn.q.kernel[...])),
        "quantized_mesh": dict(quantized.mesh.shape),
        "quantized_leaf_meshes": sorted({str(dict(x.sharding.mesh.shape))
                                         for x in jax.tree.leaves(nnx.state(quantized))}),
        "warnings": [str(w.message) for w in caught]}

    lap("transforms")
    # bad input names the axis
    out["errors"] = {
        "mesh_too_large": error_message(lambda: sharding.make_mesh(4, 4)),
        "heads": error_message(lambda: sharding.shard(model_of(config(n_heads=4, head_dim=16)),
                                                      sharding.make_mesh(1, 8))),
    }
    return out


def padded(model: dl.Transformer, rows: list[list[int]], ref, sampled_ref) -> dict:
    """Batches of 2 and 6 on a data axis of 4 (padded to 4 and 8 rows, the padding never
    returned) against one device: generate (greedy, and sampled with seed 7: ``sampled_ref`` is
    the parameters and the output of the 8-row batch, whose row r draws as row r of any batch),
    speculative decoding, beam search, and an engine of 6 slots."""
    smodel = sharding.shard(model, sharding.make_mesh(4, 2))
    greedy, (sampled, ref_sampled) = dl.SamplingParams.greedy(), sampled_ref
    out = {}
    for B in (2, 6):
        got = dl.generate(smodel, rows[:B], greedy, STEPS, options=MAX_LEN_32)
        got_sampled = dl.generate(smodel, rows[:B], sampled, STEPS, seed=7, options=MAX_LEN_32)
        spec = dl.speculative_generate(smodel, dl.NgramDrafter(), rows[:B], greedy, 3, STEPS)
        beam = dl.beam_search(smodel, rows[:B], 2, STEPS, max_len=32)
        ref_beam = dl.beam_search(model, rows[:B], 2, STEPS, max_len=32)
        out[f"batch {B}"] = {
            "shape": list(got.tokens.shape),
            "generate": bool((got.tokens == ref.tokens[:B]).all()),
            "sampled": bool((got_sampled.tokens == ref_sampled.tokens[:B]).all()),
            "speculative": bool((spec.tokens == ref.tokens[:B]).all()),
            "beam": bool((beam.tokens == ref_beam.tokens).all()),
            "beam_shape": list(beam.tokens.shape)}
    requests = [Request(id=i, prompt=tuple(r), max_new_tokens=STEPS) for i, r in enumerate(rows)]
    engine = SlotEngine(smodel, num_slots=6, max_len=32)
    done = engine.run(requests, n=4)
    out["engine"] = {"slots": len(engine.free_slots), "rows": engine.state.tokens.shape[0],
                     "tokens_equal": all(done[i].tokens == ref.tokens[i].tolist()
                                         for i in range(len(rows)))}
    return out


def process() -> dict:
    """This process's view of one greedy generate over every process's devices (programs()
    holds the single-device result of the same call)."""
    smodel = sharding.shard(model_of(config("rope", 2)), sharding.make_mesh(1, 8))
    got = dl.generate(smodel, prompts(), dl.SamplingParams.greedy(), STEPS, options=MAX_LEN_32)
    return {"process": jax.process_index(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "tokens": got.tokens.tolist()}


if __name__ == "__main__":
    if MODE == "matrix":
        result = matrix([tuple(int(n) for n in m.split("x")) for m in sys.argv[2:]])
    elif MODE == "programs":
        result = programs()
    else:
        result = process()
    print(json.dumps(result))
