"""The core's single-precision FMA peak, measured with a register-only MLIR kernel.

A loop of independent `vector.fma` chains on the widest vectors the CPU has, enough chains to
cover the FMA latency: what no schedule can beat on one thread. Figures are reported against
it (the roofline), as LoopTune normalizes by a measured peak.
"""

from __future__ import annotations

import numpy as np

from mlirrl_jax.measure.compile import compile_kernel
from mlirrl_jax.measure.fingerprint import vector_lanes
from mlirrl_jax.measure.timing import TimingMethod, time_calls
from mlirrl_jax.programs.ir import KERNEL_NAME

ITERATIONS = 200_000


def _source(lanes: int, chains: int) -> str:
    vec = f"vector<{lanes}xf32>"
    start = ", ".join(f"%b{i} = %zero" for i in range(chains))
    types = ", ".join([vec] * chains)
    fmas = "\n".join(f"    %n{i} = vector.fma %x, %y, %b{i} : {vec}" for i in range(chains))
    sums = "\n".join(f"  %s{i} = arith.addf %s{i - 1}, %r#{i} : {vec}" for i in range(1, chains))
    return f"""
func.func @{KERNEL_NAME}(%out: memref<{lanes}xf32>, %in: memref<{lanes}xf32>)
    attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = arith.constant {ITERATIONS} : index
  %zero = arith.constant dense<0.0> : {vec}
  %x = vector.load %in[%c0] : memref<{lanes}xf32>, {vec}
  %y = arith.addf %x, %x : {vec}
  %r:{chains} = scf.for %i = %c0 to %n step %c1 iter_args({start}) -> ({types}) {{
{fmas}
    scf.yield {", ".join(f"%n{i}" for i in range(chains))} : {types}
  }}
  %s0 = arith.addf %r#0, %zero : {vec}
{sums}
  vector.store %s{chains - 1}, %out[%c0] : memref<{lanes}xf32>, {vec}
  return
}}
"""


def fma_peak_gflops(chains: int = 16) -> float:
    """Measured f32 GFLOP/s of `chains` independent FMA chains on the widest vectors."""
    lanes = vector_lanes()
    kernel = compile_kernel(_source(lanes, chains), None)
    out = np.zeros(lanes, np.float32)
    values = np.full(lanes, 1e-6, np.float32)
    packed, keep_alive = kernel.pack([out, values])
    stats = time_calls(
        lambda: kernel.function(packed), TimingMethod(min_repeats=30, min_time_s=0.3)
    )
    del keep_alive
    return ITERATIONS * chains * lanes * 2 / stats.median_s * 1e-9
