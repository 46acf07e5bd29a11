"""How repeatable are stored measurements? The noise floor a cost model is judged against.

    python bench/measurement_noise.py --store data/measurements.db [--programs 12] [--per-program 10]

Picks programs at random from the store (each with its measured baseline) and a random sample
of their stored schedules, measures them again now, one at a time in one worker, and compares
the new times with the stored ones with the same metrics the surrogate is judged by: MAPE of the
speedup over the baseline, per-program Spearman, pairwise accuracy. A perfect cost model cannot
agree with the stored data better than a second measurement does. Nothing is written to the
store.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cost_model.metrics import evaluate
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default="data/measurements.db")
    parser.add_argument("--programs", type=int, default=12)
    parser.add_argument("--per-program", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    machine = machine_fingerprint()["machine_id"]
    empty = Schedule().hash
    with MeasurementStore(args.store, create=False) as store:
        rows = [r for r in store.rows(machine_id=machine, status="ok") if r["threads"] == 1]
        by_program: dict[str, list[dict]] = {}
        for r in rows:
            by_program.setdefault(r["program_hash"], []).append(r)
        eligible = [
            h
            for h, rs in by_program.items()
            if len(rs) > args.per_program and any(r["schedule_hash"] == empty for r in rs)
        ]
        chosen = rng.choice(eligible, size=min(args.programs, len(eligible)), replace=False)
        work = []
        for h in chosen:
            rs = by_program[h]
            base = next(r for r in rs if r["schedule_hash"] == empty)
            others = [r for r in rs if r["schedule_hash"] != empty]
            picks = rng.choice(len(others), size=args.per_program, replace=False)
            work += [(store.program(h), base)] + [(store.program(h), others[i]) for i in picks]
    stored, again, program_ix, is_base = [], [], [], []
    started = time.perf_counter()
    with Runner() as runner:
        for i, (program, row) in enumerate(work):
            m = runner.measure(program, Schedule.from_json(row["schedule"]))
            if not m.ok:
                print(f"  {program.name}: {m.status} on re-measurement ({m.error})")
                continue
            stored.append(np.log(row["median_s"]))
            again.append(np.log(m.median_s))
            program_ix.append(list(chosen).index(program.hash))
            is_base.append(row["schedule_hash"] == empty)
            if (i + 1) % 20 == 0:
                elapsed = time.perf_counter() - started
                print(
                    f"  {i + 1}/{len(work)} measured, {(i + 1) / elapsed:.2f}/s, "
                    f"ETA {(len(work) - i - 1) * elapsed / (i + 1):.0f} s"
                )
    stored, again = np.array(stored), np.array(again)
    metrics = evaluate(again, stored, np.array(program_ix), np.array(is_base))
    ratio = np.abs(again - stored)
    print(
        f"\n{len(stored)} stored measurements re-measured alone ({len(chosen)} programs), "
        f"machine {machine}"
    )
    print("| metric (re-measurement as the 'prediction') | value |")
    print("|---|---|")
    print(f"| median abs log ratio, same schedule | {np.median(ratio):.3f} |")
    print(f"| 90th percentile abs log ratio | {np.percentile(ratio, 90):.3f} |")
    for key in ("mape_speedup", "spearman", "pairwise_accuracy", "top1"):
        print(f"| {key} | {metrics[key]:.3f} |")


if __name__ == "__main__":
    main()
