"""One process of a two-process training run, started by tests/test_multihost.py (4 fake CPU
devices per process, joined into one 8-device runtime through jax.distributed and gloo).

    PYTHONPATH=. python tests/multihost_checks.py ADDRESS NUM_PROCESSES PROCESS_ID WORKDIR

It trains the tiny config of test_multihost.py through ``pipeline.load_or_train`` (what
``experiments/train.py`` calls) on a 2 x 4 mesh (data over the processes, model within each),
saves its own copy of the trained parameters to ``WORKDIR/process<ID>.npz`` and prints one JSON
object on its last line: what this process saw.
"""

from __future__ import annotations

import json
import pathlib
import sys

from xla_flags import set_xla_flags  # tests/, the script's folder

# The suite's XLA flags (xla_flags.py: cheaper compiles) and the fake devices with a thread pool
# that their collectives cannot exhaust (fake_cpu_environment); the environment's flags are
# dropped.
set_xla_flags(keep_environment=False)
from decodelab.measure.mesh_timing import fake_cpu_environment  # noqa: E402

fake_cpu_environment(4)

import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from decodelab import sharding  # noqa: E402
from decodelab.experiment import artefacts as pipeline

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_multihost import MODEL, TOKENIZER, TRAIN  # noqa: E402


def main(address: str, num_processes: int, process_id: int, workdir: pathlib.Path) -> dict:
    sharding.initialize(address, num_processes, process_id)
    mesh = sharding.make_mesh(data=2, model=4)
    result = pipeline.load_or_train(TOKENIZER, MODEL, TRAIN, workdir, mesh=mesh, progress=False)
    params = multihost_utils.process_allgather(nnx.to_pure_dict(nnx.state(result.model)),
                                               tiled=True)
    flat = {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(workdir / f"process{process_id}.npz", **flat)
    return {"process": jax.process_index(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "step": result.step,
            "losses": [entry["loss"] for entry in result.history],
            "q_shard_shape": list(result.model.blocks[0].attn.q.kernel[...]
                                  .addressable_shards[0].data.shape)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                          pathlib.Path(sys.argv[4]))))
