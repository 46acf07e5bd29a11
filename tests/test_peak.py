"""The FMA peak: chains sized to the register file, and no kernel on this machine above it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure import peak
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs.ir import load_program

AVX2 = {"isa_flags": ["avx", "avx2", "fma", "sse4_2"]}
AVX512 = {"isa_flags": ["avx", "avx2", "avx512f", "fma", "sse4_2"]}


def test_chain_counts_leave_the_operands_a_register_on_avx2_and_go_wider_on_avx512():
    assert peak.vector_registers(AVX2) == 16 and peak.vector_registers(AVX512) == 32
    assert max(peak.chain_counts(AVX2)) == 14  # 16 chains and 2 operands spill
    assert 8 in peak.chain_counts(AVX2)  # latency 4 x 2 FMA pipes
    assert max(peak.chain_counts(AVX512)) == 24 and 16 in peak.chain_counts(AVX512)


def _sgemm_gflops(n: int = 768, repeats: int = 9) -> float:
    """One-thread BLAS sgemm (NumPy's), the median of `repeats`."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    times = []
    with threadpool_limits(1):
        a @ b
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * n**3 / float(np.median(times)) * 1e-9


@pytest.mark.measures
def test_no_kernel_on_this_machine_runs_above_the_measured_peak():
    program = load_program("examples/matmul.mlir")
    with Runner(timeout_s=60) as runner:
        m = runner.measure(program, heuristic_schedule(program, 1), threads=1)
    assert m.ok and m.verified
    # the peak twice, around the kernels: a burst of load on the other core lowers one of them
    best = max(peak.fma_peak_gflops(), peak.fma_peak_gflops())
    matmul = program.flops / m.median_s * 1e-9
    sgemm = _sgemm_gflops()
    assert matmul <= best, f"the heuristic's matmul at {matmul:.1f} GFLOP/s, peak {best:.1f}"
    assert sgemm <= best, f"one-thread sgemm at {sgemm:.1f} GFLOP/s, peak {best:.1f}"
