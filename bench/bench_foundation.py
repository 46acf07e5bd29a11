"""Foundation benchmark: hand (heuristic) schedules vs unscheduled and vs NumPy, measurement cost.

Interleaved rounds: each round measures the unscheduled kernel, the scheduled kernel (each a
fresh compile in the worker, median over its own repeats) and NumPy's matmul with one BLAS
thread in this process; figures are medians over rounds and ratios within a round.

    python bench/bench_foundation.py [--rounds 15]
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_foundation.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.peak import fma_peak_gflops
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod, time_calls
from mlirrl_jax.programs import generate
from mlirrl_jax.programs.ir import parse_program

CASES = {
    "matmul 256x256x256": generate.MatmulSpec(256, 256, 256),
    "conv_2d 1x34x34x32 * 3x3x32x64": generate.Conv2dSpec("nhwc", 1, 34, 34, 32, 64, 3),
    # operands fit in L1/L2: the register tile's throughput, a practical FMA peak of this core
    "in-cache matmul 16x64x2048": generate.MatmulSpec(16, 64, 2048),
}
METHOD = TimingMethod(min_repeats=10, min_time_s=0.2)  # for the figures; costs use the default


def numpy_matmul_seconds(m: int, n: int, k: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.random((m, k), dtype=np.float32)
    b = rng.random((k, n), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    with threadpool_limits(1):
        return time_calls(lambda: np.matmul(a, b, out=out), METHOD).median_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    blas = [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()]
    print(
        f"date {time.strftime('%Y-%m-%d')}  machine {machine_fingerprint()['cpu_model']} "
        f"({os.cpu_count()} cores, {platform.machine()}, id {machine_fingerprint()['machine_id']})"
    )
    print(f"BLAS {blas}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}")
    programs = {
        name: parse_program(generate.render(spec), spec.name) for name, spec in CASES.items()
    }
    schedules = {name: heuristic_schedule(p) for name, p in programs.items()}
    base = {name: [] for name in CASES}
    tuned = {name: [] for name in CASES}
    cost = {name: [] for name in CASES}
    numpy_s = []
    with Runner() as runner:
        runner.measure(programs["matmul 256x256x256"])  # start the worker outside the figures
        for round_index in range(args.rounds):
            for name, program in programs.items():
                b = runner.measure(program, method=METHOD)
                t = runner.measure(program, schedules[name], method=METHOD)
                assert b.ok and t.ok, (b.error, t.error)
                base[name].append(b.median_s)
                tuned[name].append(t.median_s)
                # the cost of a measurement as collection jobs and the CLI make it
                cost[name].append(runner.measure(program, schedules[name]).wall_s)
            numpy_s.append(numpy_matmul_seconds(256, 256, 256))
            print(f"  round {round_index + 1}/{args.rounds}", flush=True)
    print()
    print(
        "| kernel | unscheduled ms | scheduled ms | speedup (median of per-round ratios) "
        "| GFLOP/s | one measurement s (median) |"
    )
    print("|---|---|---|---|---|---|")
    for name, program in programs.items():
        ratios = [b / t for b, t in zip(base[name], tuned[name])]
        med_t = statistics.median(tuned[name])
        print(
            f"| {name} | {statistics.median(base[name]) * 1e3:.3f} | {med_t * 1e3:.3f} "
            f"| {statistics.median(ratios):.1f}x | {program.flops / med_t * 1e-9:.1f} "
            f"| {statistics.median(cost[name]):.3f} |"
        )
    mm = "matmul 256x256x256"
    vs_numpy = [n / t for n, t in zip(numpy_s, tuned[mm])]
    print(
        f"\nNumPy matmul, 1 BLAS thread: {statistics.median(numpy_s) * 1e3:.3f} ms; "
        f"scheduled MLIR speed relative to NumPy: {statistics.median(vs_numpy):.2f}x "
        f"(median of per-round ratios, {args.rounds} rounds)"
    )
    peak = fma_peak_gflops()
    mm_gflops = programs[mm].flops / statistics.median(tuned[mm]) * 1e-9
    print(
        f"FMA peak of one core (register-only loop): {peak:.1f} GFLOP/s; the scheduled matmul "
        f"runs at {mm_gflops / peak:.0%} of it. A 50x speedup over the unscheduled matmul would "
        f"need {programs[mm].flops / (statistics.median(base[mm]) / 50) * 1e-9:.1f} GFLOP/s."
    )
    print("schedules: " + "; ".join(f"{n}: {s.describe()}" for n, s in schedules.items()))


if __name__ == "__main__":
    main()
