"""Measure every program of a suite unscheduled and with the heuristic schedule.

Checks that every built-in program compiles, verifies and has a baseline of about a second or
less, and shows how far the heuristic schedule gets. One timed run after the verified one per
kernel (a sweep, not a benchmark); results as a Markdown table and JSON.

    python bench/sweep_suite.py [--suite dl-v0] [--out runs/sweep-dl-v0]
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
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod, speedup
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program

SWEEP = TimingMethod(min_repeats=1, min_time_s=0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="dl-v0")
    parser.add_argument("--out", default=None)
    parser.add_argument("--limit", type=int, default=0, help="only the first N programs")
    args = parser.parse_args()
    out = Path(args.out or f"runs/sweep-{args.suite}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    entries = suites.suite(args.suite)[: args.limit or None]
    rows = []
    start = time.perf_counter()
    with Runner(timeout_s=120) as runner:
        for index, entry in enumerate(entries, 1):
            program = load_program(entry.uri)
            base = runner.measure(program, method=SWEEP)
            tuned = runner.measure(program, heuristic_schedule(program), method=SWEEP)
            rows.append(
                {
                    "uri": entry.uri,
                    "kind": entry.kind,
                    "split": entry.split,
                    "baseline_s": base.median_s,
                    "baseline_status": base.status,
                    "scheduled_s": tuned.median_s,
                    "status": tuned.status,
                    "error": tuned.error,
                    "speedup": speedup(base, tuned),
                }
            )
            elapsed = time.perf_counter() - start
            print(
                f"[{index}/{len(entries)}] {entry.uri.split('/')[-1]}: base {base.status} "
                f"{(base.median_s or 0) * 1e3:.1f} ms, heuristic {tuned.status} "
                f"{(tuned.median_s or 0) * 1e3:.2f} ms  ({elapsed / index:.2f} s/program, "
                f"ETA {elapsed / index * (len(entries) - index):.0f} s)",
                flush=True,
            )
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    by_kind = collections.defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
    lines = [
        "| kind | programs | baseline ok | heuristic ok | max baseline s | geomean speedup |",
        "|---|---|---|---|---|---|",
    ]
    for kind, group in sorted(by_kind.items()):
        gains = [r["speedup"] for r in group if r["speedup"]]
        geo = math.exp(statistics.mean(math.log(g) for g in gains)) if gains else float("nan")
        worst = max((r["baseline_s"] or 0) for r in group)
        lines.append(
            f"| {kind} | {len(group)} | {sum(r['baseline_status'] == 'ok' for r in group)} "
            f"| {sum(r['status'] == 'ok' for r in group)} | {worst:.2f} | {geo:.1f}x |"
        )
    table = "\n".join(lines)
    (out / "sweep.md").write_text(table + "\n")
    print(table)
    failures = [r for r in rows if r["status"] != "ok" or r["baseline_status"] != "ok"]
    for r in failures:
        print(
            f"FAILED {r['uri']}: {r['baseline_status']} / {r['status']}: {(r['error'] or '')[:300]}"
        )


if __name__ == "__main__":
    main()
