"""The core's single-precision FMA peak, measured with a register-only MLIR kernel.

A loop of independent `vector.fma` chains on the widest vectors the CPU has: what no schedule
can beat on one thread. Figures are reported against it (the roofline), as LoopTune normalizes
by a measured peak.

Enough chains must be in flight to cover the FMA latency times the FMAs issued per cycle (4 x 2
on current x86 cores), and no more than the vector registers hold beside the two operands: with
AVX2's 16 registers, 16 chains spill to the stack and the kernel runs at half the core's peak.
The latency and the issue width are the core's and not in any flag, so every chain count that
fits the register file is measured and the fastest is the peak.
"""

from __future__ import annotations

import numpy as np

from mlirrl_jax.measure.compile import compile_kernel
from mlirrl_jax.measure.fingerprint import machine_fingerprint, vector_lanes
from mlirrl_jax.measure.timing import TimingMethod, time_calls
from mlirrl_jax.programs.ir import KERNEL_NAME

ITERATIONS = 200_000
OPERAND_REGISTERS = 2  # the two multiplied vectors, loop-invariant, kept in registers
CHAIN_COUNTS = (6, 8, 10, 12, 14, 16, 20, 24)  # covers latency x issue width 4 x 2 to 6 x 4


def vector_registers(machine: dict | None = None) -> int:
    """Architectural vector registers: 32 with AVX-512 and on Arm (NEON, SVE), else 16."""
    flags = set((machine or machine_fingerprint())["isa_flags"])
    return 32 if flags & {"avx512f", "asimd", "neon", "sve"} else 16


def chain_counts(machine: dict | None = None) -> tuple[int, ...]:
    """The chain counts worth measuring: those whose accumulators and operands all fit the
    vector registers."""
    room = vector_registers(machine) - OPERAND_REGISTERS
    return tuple(c for c in CHAIN_COUNTS if c <= room)


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


def chain_gflops(chains: int) -> float:
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


def fma_peak_gflops() -> float:
    """One core's f32 FMA peak in GFLOP/s: the fastest of the chain counts that fit the
    register file (`chain_counts`)."""
    return max(chain_gflops(chains) for chains in chain_counts())
