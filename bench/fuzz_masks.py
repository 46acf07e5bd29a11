"""Fuzz the masks: random masked episodes over the train suite, each schedule measured for real.

    python bench/fuzz_masks.py [--episodes 1000] [--seed 0] [--threads 1] [--suite dl-v0]
                               [--out runs/fuzz]

Prints the share that compiled, ran and verified, and every kind of failure with a count;
writes each failing (program, schedule, actions) to failures.json for replay.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.fuzz import failure_kinds, fuzz, remainder_tiles
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.schedule import PACK


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/fuzz")
    parser.add_argument(
        "--next-weight",
        type=float,
        default=0.2,
        help="relative probability of moving on to the next op (1: uniform)",
    )
    parser.add_argument("--threads", type=int, default=1, help="threads of the foralls")
    parser.add_argument(
        "--suite",
        action="append",
        help="suites whose train split is drawn from (repeatable; default dl-v0)",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    programs = [
        load_program(e.uri) for name in args.suite or ["dl-v0"] for e in suites.split(name, "train")
    ]
    table = encode_programs(programs)
    results = []
    start = time.perf_counter()
    with Runner(timeout_s=60) as runner:
        for i, result in enumerate(
            fuzz(programs, table, args.episodes, args.seed, runner, args.next_weight, args.threads),
            1,
        ):
            results.append(result)
            ok = sum(r.measurement.ok for r in results)
            if i % 25 == 0 or not result.measurement.ok:
                rate = i / (time.perf_counter() - start)
                print(
                    f"[{i}/{args.episodes}] verified {ok}/{i} ({ok / i:.1%}); {rate:.2f} episodes/s, "
                    f"ETA {(args.episodes - i) / rate:.0f} s"
                    + (
                        ""
                        if result.measurement.ok
                        else f"  FAIL {result.program}: {result.measurement.status}"
                    ),
                    flush=True,
                )
    ok = sum(r.measurement.ok for r in results)
    print(
        f"\n{time.strftime('%Y-%m-%d')}: {ok}/{len(results)} random masked episodes compiled, ran "
        f"and verified ({ok / len(results):.2%}) at {args.threads} thread(s) on machine "
        f"{machine_fingerprint()['machine_id']}; suites {args.suite or ['dl-v0']}, seed "
        f"{args.seed}, next weight {args.next_weight}; "
        f"{len(results) / (time.perf_counter() - start):.2f} episodes/s"
    )
    transforms = sum(len(o.transforms) for r in results for o in r.schedule.ops)
    print(f"mean transformations per schedule: {transforms / len(results):.2f}")
    by_name = {p.name: p for p in programs}
    partial = [r for r in results if remainder_tiles(by_name[r.program], r.schedule)]
    print(
        f"schedules with a tile that leaves a partial last one: {len(partial)}, "
        f"{sum(r.measurement.ok for r in partial)} of them verified"
    )
    packed = [
        r for r in results if any(t.kind == PACK for o in r.schedule.ops for t in o.transforms)
    ]
    print(
        f"schedules that pack an op: {len(packed)}, "
        f"{sum(r.measurement.ok for r in packed)} of them verified"
    )
    for kind, count in failure_kinds(results).items():
        print(f"  {count:4d}  {kind}")
    failures = [
        {
            "program": r.program,
            "schedule": r.schedule.to_json(),
            "actions": [a.tolist() for a in r.actions],
            "status": r.measurement.status,
            "error": r.measurement.error,
        }
        for r in results
        if not r.measurement.ok
    ]
    (out / "failures.json").write_text(json.dumps(failures, indent=1))


if __name__ == "__main__":
    main()
