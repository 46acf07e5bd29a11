"""Memory-bound ops (pooling, element-wise): which rule beats LLVM's own loops on them.

For each program (the pooling and element-wise layers of `awkward-v0` and of the dl-v0 test
split) and each thread count, in one run and one worker, every output verified: the
unscheduled program; heuristic v2 (register tile, decomposition, vectorization); "split":
the outermost parallel loop cut into one chunk per thread (`tile_parallel`), the chunk's body
left to LLVM; "row": the same split, then every loop tiled to 1 but the output's contiguous
one, kept whole (a sliding window decomposed first), vectorized: one row a vector operation;
and heuristics v3 to v5, whose rule for these ops (`heuristics.memory_bound_schedule`) chooses
between them from the op's work and the machine's vector width (v4 is v3 here; v5 cuts a
pooling row to one vector). `--programs nchw` measures NCHW max and average pools of real
networks' layers at batch 32-256 instead (no suite has NCHW pooling).
Each variant and the baseline are measured `--repeats` times, interleaved (millisecond kernels
drift by tens of percent here); prints the median speedup over unscheduled per program, and
geomeans per kind and thread count.

    python bench/memory_bound.py [--programs suites|nchw] [--variants row,heuristic_v5,...]
        [--threads 1,2] [--repeats 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time
from pathlib import Path

from mlirrl_jax.heuristics import heuristic_schedule, row_vectorized, split_over_threads
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.generate import PoolSpec, render
from mlirrl_jax.programs.ir import Program, load_program, parse_program
from mlirrl_jax.schedule import Schedule

KINDS = ("pooling", "elementwise")


def per_op(program: Program, steps_of) -> Schedule:
    ops = [(op.id, steps_of(op)) for op in reversed(program.ops) if op.kind != "fill"]
    return Schedule.of([(op, steps) for op, steps in ops if steps])


VARIANTS = {
    "heuristic_v2": lambda p, t: heuristic_schedule(p, t, version=2),
    "split": lambda p, t: per_op(p, lambda op: split_over_threads(op, t)),
    "row": lambda p, t: per_op(p, lambda op: [*split_over_threads(op, t), *row_vectorized(op)]),
    "heuristic_v3": lambda p, t: heuristic_schedule(p, t, version=3),
    "heuristic_v5": lambda p, t: heuristic_schedule(p, t, version=5),
}

# NCHW pools of real networks (input already padded): AlexNet's three max pools and an average
# pool at batch 256, ResNet's stem pool at batch 32, a GoogLeNet-style 3x3/1 pool at batch 64
NCHW_POOLS = (
    PoolSpec("max", 256, 55, 55, 64, 3, 2, layout="nchw"),
    PoolSpec("max", 256, 27, 27, 192, 3, 2, layout="nchw"),
    PoolSpec("max", 256, 13, 13, 256, 3, 2, layout="nchw"),
    PoolSpec("avg", 256, 14, 14, 256, 2, 2, layout="nchw"),
    PoolSpec("max", 32, 113, 113, 64, 3, 2, layout="nchw"),
    PoolSpec("max", 64, 30, 30, 192, 3, 1, layout="nchw"),
)


def programs(which: str = "suites") -> list[Program]:
    if which == "nchw":
        return [parse_program(render(spec), spec.name) for spec in NCHW_POOLS]
    entries = [*suites.suite("awkward-v0"), *suites.split("dl-v0", "test")]
    found = []
    for e in entries:
        program = load_program(e.uri)
        if {op.kind for op in program.ops} - {"fill"} <= set(KINDS):
            found.append(program)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved measurements each")
    parser.add_argument("--programs", choices=("suites", "nchw"), default="suites")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    machine = machine_fingerprint()["machine_id"]
    out = Path(args.out or f"runs/memory-bound-{machine}")
    out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in args.threads.split(",")]
    chosen = programs(args.programs)
    rows = []
    started = time.perf_counter()
    with Runner(timeout_s=120) as runner:
        for i, program in enumerate(chosen, 1):
            kind = next(op.kind for op in program.ops if op.kind != "fill")
            variants = [(t, name, VARIANTS[name](program, t)) for t in threads for name in names]
            times: dict = collections.defaultdict(list)
            # kernels of a millisecond drift by tens of percent on a shared machine: every
            # variant and the baseline are measured `repeats` times, interleaved, and compared
            # by their medians
            for _ in range(args.repeats):
                base = runner.measure(program, None)
                times["base"].append(base.median_s if base.ok else math.nan)
                for t, name, schedule in variants:
                    m = runner.measure(program, schedule, threads=t)
                    times[(t, name)].append(m.median_s if m.ok else math.nan)
            base_s = statistics.median(times["base"])
            for t, name, schedule in variants:
                tuned = times[(t, name)]
                ok = not any(math.isnan(x) for x in tuned)
                rows.append(
                    {
                        "program": program.name,
                        "kind": kind,
                        "threads": t,
                        "variant": name,
                        "schedule": schedule.to_json(),
                        "times_s": tuned,
                        "baseline_s": times["base"],
                        "speedup": base_s / statistics.median(tuned) if ok else None,
                    }
                )
            rate = i / (time.perf_counter() - started)
            print(
                f"[{i}/{len(chosen)}] {program.name}; {rate:.2f} programs/s, "
                f"ETA {(len(chosen) - i) / rate:.0f} s",
                flush=True,
            )
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"\nmachine {machine}, {time.strftime('%Y-%m-%d')}; speedup over unscheduled")
    header = " | ".join(f"{n} ({t}t)" for t in threads for n in names)
    print(f"| program | {header} |")
    print("|---|" + "---|" * (len(threads) * len(names)))
    by = {(r["program"], r["threads"], r["variant"]): r["speedup"] for r in rows}
    for program in chosen:
        cells = [by.get((program.name, t, n)) for t in threads for n in names]
        print(
            f"| {program.name} | "
            + " | ".join("fail" if c is None else f"{c:.2f}" for c in cells)
            + " |"
        )
    geo = collections.defaultdict(list)
    for r in rows:
        if r["speedup"]:
            geo[(r["kind"], r["threads"], r["variant"])].append(math.log(r["speedup"]))
    print("\ngeomean per kind")
    print(f"| kind | {header} |")
    print("|---|" + "---|" * (len(threads) * len(names)))
    for kind in KINDS:
        cells = [geo.get((kind, t, n)) for t in threads for n in names]
        print(
            f"| {kind} | "
            + " | ".join("-" if not c else f"{math.exp(sum(c) / len(c)):.2f}" for c in cells)
            + " |"
        )


if __name__ == "__main__":
    main()
