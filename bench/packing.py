"""Packed panels (heuristic version 4) against version 3: a matmul's B, a convolution's filter.

For each program whose version-4 schedule packs (of awkward-v0, dl-v0's test split and every
matmul and batch matmul of dl-v0), at each thread count, in one run and one worker, every output verified:
heuristic v3 (cache tile of at most 64, register tile, decomposition of a window,
vectorization) and v4 (matmuls: cache tile blocking the lanes loop and the reduction into a
panel, register tile, B packed per panel, vectorization; convolutions: v3's tiles, the filter
packed per cache tile, decomposition, vectorization). Both are measured `--repeats` times, interleaved, and compared by medians.
Prints GFLOP/s, the share of the machine's measured FMA peak (`measure/peak.py`, times the
thread count) and v4 / v3 per program, and the geomean ratio per thread count.

    python bench/packing.py [--threads 1,2] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time
from pathlib import Path

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.peak import fma_peak_gflops
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.schedule import PACK

VERSIONS = (3, 4)


def programs() -> list[Program]:
    """awkward-v0, dl-v0's matmuls and batch matmuls, and dl-v0's test split: where v4 packs."""
    entries = [*suites.suite("awkward-v0"), *suites.split("dl-v0", "test")]
    entries += [e for e in suites.suite("dl-v0") if e.kind in ("matmul", "batch_matmul")]
    found, seen = [], set()
    for e in entries:
        if e.uri in seen:
            continue
        seen.add(e.uri)
        program = load_program(e.uri)
        packs = heuristic_schedule(program, 1, version=4)
        if any(t.kind == PACK for o in packs.ops for t in o.transforms):
            found.append(program)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements each")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    machine = machine_fingerprint()["machine_id"]
    out = Path(args.out or f"runs/packing-{machine}")
    out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in args.threads.split(",")]
    peak = fma_peak_gflops()
    chosen = programs()
    print(f"{len(chosen)} programs pack; FMA peak {peak:.1f} GFLOP/s per core", flush=True)
    rows = []
    started = time.perf_counter()
    with Runner(timeout_s=120) as runner:
        for i, program in enumerate(chosen, 1):
            for t in threads:
                schedules = {v: heuristic_schedule(program, t, version=v) for v in VERSIONS}
                times: dict = collections.defaultdict(list)
                for _ in range(args.repeats):
                    for v, schedule in schedules.items():
                        m = runner.measure(program, schedule, threads=t)
                        times[v].append(m.median_s if m.ok else math.nan)
                row = {"program": program.name, "threads": t, "flops": program.flops}
                for v, schedule in schedules.items():
                    ok = not any(math.isnan(x) for x in times[v])
                    gflops = program.flops / statistics.median(times[v]) / 1e9 if ok else None
                    row[f"v{v}"] = {
                        "schedule": schedule.to_json(),
                        "times_s": times[v],
                        "gflops": gflops,
                        "peak_share": gflops / (peak * t) if gflops else None,
                    }
                rows.append(row)
            rate = i / (time.perf_counter() - started)
            print(
                f"[{i}/{len(chosen)}] {program.name}; {rate:.2f} programs/s, "
                f"ETA {(len(chosen) - i) / rate:.0f} s",
                flush=True,
            )
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [
        f"# Packed B panels on machine {machine}, {time.strftime('%Y-%m-%d')}",
        "",
        f"FMA peak {peak:.1f} GFLOP/s per core; medians of {args.repeats} interleaved runs.",
        "",
        "| program | threads | MFLOP | v3 GFLOP/s | v4 GFLOP/s | v3 % peak | v4 % peak | v4 / v3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    logs = collections.defaultdict(list)
    for r in rows:
        a, b = r["v3"]["gflops"], r["v4"]["gflops"]
        ratio = b / a if a and b else None
        if ratio:
            logs[r["threads"]].append(math.log(ratio))

        def cell(x, fmt):
            return "fail" if x is None else format(x, fmt)

        lines.append(
            f"| {r['program']} | {r['threads']} | {r['flops'] / 1e6:.1f} | {cell(a, '.1f')} | "
            f"{cell(b, '.1f')} | {cell(r['v3']['peak_share'], '.0%')} | "
            f"{cell(r['v4']['peak_share'], '.0%')} | {cell(ratio, '.2f')} |"
        )
    lines += ["", "| threads | programs | geomean v4 / v3 | v4 better |", "|---|---|---|---|"]
    for t in threads:
        g = logs[t]
        if g:
            better = sum(x > 0 for x in g)
            lines.append(f"| {t} | {len(g)} | {math.exp(sum(g) / len(g)):.2f} | {better} |")
    text = "\n".join(lines) + "\n"
    (out / "packing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
