"""How repeatable are stored measurements? The noise floor a cost model is judged against.

    python bench/measurement_noise.py --store data/measurements.db [--programs 12] [--per-program 10]
        [--threads 1,2] [--json noise.json]

Picks programs at random from the store (each with its measured baseline) and a random sample
of their stored schedules, measures them again now, one at a time in one worker, and compares
the new times with the stored ones with the same metrics the surrogate is judged by: MAPE of the
speedup over the baseline, per-program Spearman, pairwise accuracy. A perfect cost model cannot
agree with the stored data better than a second measurement does. Each thread count is
re-measured at that count, its figures apart; `--json` writes them keyed by thread count (what
`bench/surrogate_score.py --noise` prints beside its errors). Nothing is written to the store.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.metrics import evaluate


def noise_at(store_path: str, threads: int, args, machine: str) -> dict | None:
    """Re-measure a random sample of the store's rows of `machine` at `threads`; the metrics
    of the new times against the stored ones (None: no program with enough rows)."""
    rng = np.random.default_rng(args.seed)
    empty = Schedule().hash
    with MeasurementStore(store_path, create=False) as store:
        rows = [r for r in store.rows(machine_id=machine, status="ok") if r["threads"] == threads]
        by_program: dict[str, list[dict]] = {}
        for r in rows:
            by_program.setdefault(r["program_hash"], []).append(r)
        eligible = [
            h
            for h, rs in by_program.items()
            if len(rs) > args.per_program and any(r["schedule_hash"] == empty for r in rs)
        ]
        if not eligible:
            print(f"no program with {args.per_program}+ rows and a baseline at {threads} thread(s)")
            return None
        chosen = list(rng.choice(eligible, size=min(args.programs, len(eligible)), replace=False))
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
            m = runner.measure(program, Schedule.from_json(row["schedule"]), threads=threads)
            if not m.ok:
                print(f"  {program.name}: {m.status} on re-measurement ({m.error})")
                continue
            stored.append(np.log(row["median_s"]))
            again.append(np.log(m.median_s))
            program_ix.append(chosen.index(program.hash))
            is_base.append(row["schedule_hash"] == empty)
            if (i + 1) % 20 == 0:
                elapsed = time.perf_counter() - started
                print(
                    f"  {threads} thread(s): {i + 1}/{len(work)} measured, "
                    f"{(i + 1) / elapsed:.2f}/s, ETA {(len(work) - i - 1) * elapsed / (i + 1):.0f} s"
                )
    stored, again = np.array(stored), np.array(again)
    metrics = evaluate(again, stored, np.array(program_ix), np.array(is_base))
    ratio = np.abs(again - stored)
    return {
        **metrics,
        "rows": len(stored),
        "median_abs_log_ratio": float(np.median(ratio)),
        "p90_abs_log_ratio": float(np.percentile(ratio, 90)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default="data/measurements.db")
    parser.add_argument("--programs", type=int, default=12)
    parser.add_argument("--per-program", type=int, default=10)
    parser.add_argument("--threads", default="1", help="thread counts, e.g. 1,2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the figures here, by thread count")
    args = parser.parse_args()
    machine = machine_fingerprint()["machine_id"]
    figures = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        result = noise_at(args.store, threads, args, machine)
        if result is not None:
            figures[str(threads)] = result
    print(f"\nstored measurements re-measured alone, machine {machine}")
    print(
        "| threads | rows | median abs log ratio | p90 | MAPE speedup | Spearman | pairwise | top-1 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t, m in figures.items():
        print(
            f"| {t} | {m['rows']} | {m['median_abs_log_ratio']:.3f} | {m['p90_abs_log_ratio']:.3f} "
            f"| {m['mape_speedup']:.1%} | {m['spearman']:.3f} | {m['pairwise_accuracy']:.3f} "
            f"| {m['top1']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, **figures}, indent=1))


if __name__ == "__main__":
    main()
