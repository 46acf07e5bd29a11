"""Collection throughput: measurements per second of a collection job on small programs.

    python bench/bench_collect.py [--workers 2] [--budget 300] [--max-mflops 1]

Runs a real collection (sampling, compiling, verifying, timing with the default method,
committing to a fresh SQLite store) over the train programs of at most --max-mflops MFLOP, and
prints the rate over the whole job, start-up included.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from mlirrl_jax.collect import CollectConfig, CollectionJob
from mlirrl_jax.measure.fingerprint import machine_fingerprint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--max-mflops", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = CollectConfig(
            store=Path(tmp) / "bench.db",
            budget=args.budget,
            workers=args.workers,
            max_mflops=args.max_mflops,
            baselines_of=("train",),
        )
        started = time.perf_counter()
        job = CollectionJob(config)
        report = job.run()
        wall = time.perf_counter() - started
    print(
        f"date {time.strftime('%Y-%m-%d')}  machine {machine_fingerprint()['cpu_model']} "
        f"({os.cpu_count()} cores)"
    )
    print(
        f"{len(job.programs)} train programs of <= {args.max_mflops} MFLOP; {args.workers} workers"
    )
    print(
        f"measured {report.measured} in {wall:.1f} s (job start included): "
        f"{report.measured / wall:.2f} measurements/s; {report.failures} failures {report.by_status}"
    )


if __name__ == "__main__":
    main()
