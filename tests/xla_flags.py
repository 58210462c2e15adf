"""The XLA flags of every test process: the pytest workers (``conftest.py``) and the scripts the
tests start on fake devices (``sharding_checks.py``, ``multihost_checks.py``). Import it before
jax: XLA reads the flags once, when its CPU backend starts.

The suite compiles thousands of small programs and runs each a few times, so compile time is
most of its time:

- ``--xla_backend_optimization_level=0``: LLVM at -O0; its optimisation passes cost more than
  they save here.
- ``--xla_cpu_use_fusion_emitters=false``: XLA's older elemental emitters for loop fusions, which
  compile faster than its MLIR fusion emitters (on a cold compilation cache the whole suite took
  1659 s against 2186 s on 2 cores).
- ``--xla_cpu_parallel_codegen_split_count=1``: each program's LLVM code is one module instead
  of up to 32 parts compiled on a thread pool; the parts' overhead outweighs the parallelism on
  2 cores already busy with 2 workers (a distribution test's compiles: 9.8-10.3 s against
  11.3-12.8 s, one process, empty compilation cache).

None of them changes the optimised HLO (fusion, layout, aliasing), which the structure tests read;
float results differ from the defaults' by rounding only (a few ulps).
"""

import os

FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
         "--xla_cpu_parallel_codegen_split_count=1")


def set_xla_flags(*extra: str, keep_environment: bool = True) -> None:
    """``XLA_FLAGS`` = ``extra``, then ``FLAGS``, then (``keep_environment``) the flags already
    in the environment, which come last so that a caller's own setting wins."""
    kept = os.environ.get("XLA_FLAGS", "") if keep_environment else ""
    os.environ["XLA_FLAGS"] = " ".join(f for f in (*extra, *FLAGS, kept) if f)
