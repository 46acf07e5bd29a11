"""The measured FMA peak against what real kernels reach on the same core.

    python bench/peak_check.py --out runs/peak-check [--repeats 5]

On one core (this process pinned to the first core it may use): the FMA kernel of
`measure/peak.py` at every chain count up to 16 and beyond where the registers allow, NumPy's
one-thread BLAS sgemm at three sizes, and the heuristic's schedule of `examples/matmul.mlir`
measured by the pipeline (compiled, verified, timed). Each figure is the median of `--repeats`
measurements, each itself a median of timed calls. No kernel may exceed the peak: the table
gives each one's fraction of it.

Writes `peak.json` and `peak.md` to --out, with this machine's id and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure import peak
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs.ir import load_program

SGEMM_SIZES = (512, 1024, 2048)
PROBED_CHAINS = (4, 6, 8, 10, 12, 14, 16, 20, 24)


def sgemm_gflops(n: int, calls: int = 7) -> float:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    with threadpool_limits(1):
        a @ b
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) * 1e-9


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/peak-check")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    machine = machine_fingerprint()
    room = peak.vector_registers() - peak.OPERAND_REGISTERS
    chains = {
        c: statistics.median(peak.chain_gflops(c) for _ in range(args.repeats))
        for c in PROBED_CHAINS
        if c <= max(room, 16)
    }
    peak_now = statistics.median(peak.fma_peak_gflops() for _ in range(args.repeats))
    blas = {n: statistics.median(sgemm_gflops(n) for _ in range(args.repeats)) for n in SGEMM_SIZES}
    program = load_program("examples/matmul.mlir")
    schedule = heuristic_schedule(program, 1)
    with Runner(timeout_s=60) as runner:  # its worker inherits this process's core
        times = [runner.measure(program, schedule, threads=1).median_s for _ in range(args.repeats)]
    matmul = program.flops / statistics.median(times) * 1e-9
    libraries = [
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    results = {
        "machine_id": machine["machine_id"],
        "cpu": machine["cpu_model"],
        "isa": machine["isa_flags"],
        "date": time.strftime("%Y-%m-%d"),
        "core": core,
        "vector_registers": peak.vector_registers(),
        "chain_gflops": chains,
        "fits_registers": list(peak.chain_counts()),
        "peak_gflops": peak_now,
        "sgemm_gflops": blas,
        "blas": libraries,
        "heuristic_matmul_gflops": matmul,
        "repeats": args.repeats,
    }
    (out / "peak.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"Machine {results['machine_id']} ({results['cpu']}, {' '.join(results['isa'])}), "
        f"{results['date']}, core {core}; medians of {args.repeats}.",
        "",
        "| kernel | GFLOP/s | fraction of the peak |",
        "|---|---|---|",
    ]
    for c, g in chains.items():
        spills = "" if c <= room else f", spills ({results['vector_registers']} registers)"
        lines.append(f"| FMA kernel, {c} chains{spills} | {g:.1f} | {g / peak_now:.0%} |")
    lines.append(f"| **peak** (`fma_peak_gflops`, best that fits) | **{peak_now:.1f}** | 100% |")
    for n, g in blas.items():
        lines.append(
            f"| one-thread sgemm {n}^3 ({', '.join(libraries)}) | {g:.1f} | {g / peak_now:.0%} |"
        )
    lines.append(
        f"| heuristic schedule of examples/matmul.mlir (192x256x320) | {matmul:.1f} | "
        f"{matmul / peak_now:.0%} |"
    )
    (out / "peak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(run())
