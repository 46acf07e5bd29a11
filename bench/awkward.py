"""The schedule space on awkward extents: heuristics v1-v3, random search, the agent, XLA:CPU.

For every program of the `awkward-v0` suite (real-network layers whose extents do not divide
into whole vectors) and each thread count, in one run on this machine, every output verified:
the unscheduled program (one thread), the heuristic's three versions (v1: 32 lanes, divisors
only; v2: the machine's vector width, partial tiles peeled; v3: v2 with the rule for
memory-bound ops), random search with N real measurements (distinct masked random schedules of
the agent's action space, half uniform and half deeper, as collection draws them), with
`--agent RUN` the agent's k best schedules by its surrogate (all measured, the best kept; chosen
before any timing), and XLA:CPU through `jax.jit` on the same threads.

Prints per program and per op kind: speedups over unscheduled, the best of any method against
XLA, v3 against v1 and v2, and for matmuls and convolutions of at least 1e8 flops the best schedule's
fraction of the machine's measured FMA peak (per core, times the threads). Resumable: rows go
to `rows.jsonl` in the output folder as they are measured; rerun the same command to go on.

    python bench/awkward.py [--threads 1,2] [--random 64] [--agent RUN --top-k 8] [--out DIR]
                            [--only NAME ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import time
from pathlib import Path

import jax
from tqdm import tqdm

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.baselines import measure_xla
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.peak import fma_peak_gflops
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.sampler import EpisodeSampler, random_policy

HEURISTICS = ("heuristic_v1", "heuristic_v2", "heuristic_v3")
METHODS = (*HEURISTICS, "random", "agent", "xla")
CONTRACTIONS = ("matmul", "conv2d_nhwc", "conv2d_nchw")


def random_schedules(programs, count: int, seed: int) -> list[list]:
    """Per program, up to `count` distinct non-empty random schedules, in draw order."""
    uniform = EpisodeSampler(programs, random_policy(1.0))
    samplers = [uniform, EpisodeSampler(programs, random_policy(0.25), uniform.table)]
    found = []
    for i in range(len(programs)):
        chosen: dict = {}
        for draw in range(6 * count):
            if len(chosen) == count:
                break
            schedule, _ = samplers[draw % 2].schedule(i, jax.random.PRNGKey(seed * 7919 + draw))
            if schedule.ops:
                chosen.setdefault(schedule.hash, schedule)
        found.append(list(chosen.values()))
    return found


def _ms(m) -> float | None:
    return m.median_s * 1e3 if m and m.ok and m.verified and m.median_s else None


def measure_all(args, out: Path) -> list[dict]:
    rows_path = out / "rows.jsonl"
    done = []
    if rows_path.is_file():
        done = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()]
    have = {(r["program"], r["threads"]) for r in done}
    entries = [e for e in suites.suite("awkward-v0") if not args.only or e.name in args.only]
    todo = [(e, t) for e in entries for t in args.threads if (e.name, t) not in have]
    if not todo:
        return done
    programs = {e.name: load_program(e.uri) for e, _ in todo}
    names = list(programs)
    draws = dict(zip(names, random_schedules(list(programs.values()), args.random, args.seed)))
    agent_draws = {name: [] for name in names}
    if args.agent:  # chosen before anything is timed: no JAX work beside a timed kernel
        from mlirrl_jax.agent.agent import Agent

        agent = Agent.load(args.agent)
        chosen = agent.schedules(list(programs.values()), n=args.top_k)
        agent_draws = dict(zip(names, chosen))
    method = TimingMethod(seed=args.seed)
    bases: dict[str, float | None] = {}
    bar = tqdm(total=len(todo), unit="run", desc="awkward-v0")
    with Runner(timeout_s=args.timeout) as runner, rows_path.open("a") as sink:
        for entry, threads in todo:
            program = programs[entry.name]
            if entry.name not in bases:
                bases[entry.name] = _ms(runner.measure(program, None, method=method))
            row = {
                "program": entry.name,
                "kind": entry.kind,
                "layer": f"{entry.model}: {entry.layer}",
                "flops": entry.flops,
                "threads": threads,
                "unscheduled_ms": bases[entry.name],
                "methods": {},
                "failed": [],
            }
            for version in (1, 2, 3):
                schedule = heuristic_schedule(program, threads, version)
                m = runner.measure(program, schedule, threads=threads, method=method)
                row["methods"][f"heuristic_v{version}"] = {
                    "ms": _ms(m),
                    "schedule": schedule.to_json(),
                }
                if not (m.ok and m.verified):
                    row["failed"].append(
                        f"heuristic_v{version}: {m.status} {(m.error or '')[:200]}"
                    )
            for name, schedules in (("random", draws), ("agent", agent_draws)):
                best, best_schedule, failures = None, None, 0
                for schedule in schedules[entry.name]:
                    m = runner.measure(program, schedule, threads=threads, method=method)
                    ms = _ms(m)
                    failures += ms is None
                    if ms is not None and (best is None or ms < best):
                        best, best_schedule = ms, schedule.to_json()
                row["methods"][name] = {
                    "ms": best,
                    "schedule": best_schedule,
                    "measurements": len(schedules[entry.name]),
                    "failures": failures,
                }
            xla = measure_xla(program, threads, method, timeout_s=args.timeout)
            row["methods"]["xla"] = {"ms": _ms(xla)}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done.append(row)
            bar.update(1)
            bar.set_postfix_str(f"{entry.name[:30]} t{threads}")
    bar.close()
    return done


def _geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _f(value, fmt: str = ".2f", suffix: str = "x") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def report(rows: list[dict], peak: float, machine: str) -> str:
    lines = [
        f"# awkward-v0 on machine {machine}",
        "",
        f"Measured FMA peak {peak:.1f} GFLOP/s per core. Speedups over the unscheduled program "
        "(one thread), every output verified; '-' where a method had no verified result.",
    ]
    for threads in sorted({r["threads"] for r in rows}):
        group = [r for r in rows if r["threads"] == threads]
        lines += [
            "",
            f"## {threads} thread(s)",
            "",
            "| program | layer | unscheduled ms | heuristic v1 | heuristic v2 | heuristic v3 | "
            "random | agent | XLA | best / XLA | best % of peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        by_kind = collections.defaultdict(list)
        for r in group:
            base = r["unscheduled_ms"]
            s = {
                n: base / r["methods"][n]["ms"]
                if base and (r["methods"].get(n) or {}).get("ms")
                else None
                for n in METHODS
            }
            ours = [s[n] for n in METHODS if n != "xla" and s[n]]
            best = max(ours) if ours else None
            r["best_over_xla"] = best / s["xla"] if best and s["xla"] else None
            for old in ("heuristic_v1", "heuristic_v2"):
                r[f"v3_over_{old[-2:]}"] = (
                    s["heuristic_v3"] / s[old] if s["heuristic_v3"] and s[old] else None
                )
            fraction = None
            if best and r["kind"] in CONTRACTIONS and r["flops"] >= 1e8:
                gflops = r["flops"] / (base / best * 1e-3) * 1e-9
                fraction = gflops / (peak * threads)
            r["best_fraction_of_peak"] = fraction
            by_kind[r["kind"]].append(r)
            lines.append(
                f"| {r['program']} | {r['layer']} | {_f(base, '.3f', '')} | "
                + " | ".join(_f(s[n]) for n in METHODS)
                + f" | {_f(r['best_over_xla'])} | {_f(fraction and fraction * 100, '.0f', '%')} |"
            )
        lines += [
            "",
            "| op kind | programs | best / XLA (geomean) | heuristic v3 / v1 | heuristic v3 / v2 "
            "| best % of peak (>= 1e8 flops) |",
            "|---|---|---|---|---|---|",
        ]
        for kind, members in sorted(by_kind.items()):
            fractions = [r["best_fraction_of_peak"] for r in members if r["best_fraction_of_peak"]]
            lines.append(
                f"| {kind} | {len(members)} | {_f(_geomean(r['best_over_xla'] for r in members))} | "
                f"{_f(_geomean(r['v3_over_v1'] for r in members))} | "
                f"{_f(_geomean(r['v3_over_v2'] for r in members))} | "
                f"{_f(max(fractions) * 100 if fractions else None, '.0f', '%')} |"
            )
        failed = [f"{r['program']}: {f}" for r in group for f in r["failed"]]
        if failed:
            lines += ["", "Failures:", *(f"- {f}" for f in failed)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    parser.add_argument("--random", type=int, default=64, help="random schedules per program")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", help="only these program names")
    parser.add_argument("--agent", help="an agent run (e.g. data/agent) to measure beside")
    parser.add_argument("--top-k", type=int, default=8, help="the agent's schedules per program")
    parser.add_argument("--out", help="default: runs/awkward-<machine id>")
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    machine = machine_fingerprint()["machine_id"]
    out = Path(args.out or f"runs/awkward-{machine}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = measure_all(args, out)
    peak = fma_peak_gflops()
    text = report(rows, peak, machine)
    (out / "awkward.md").write_text(text + "\n")
    (out / "awkward.json").write_text(
        json.dumps({"machine_id": machine, "peak_gflops": peak, "rows": rows}, indent=1)
    )
    print(text)
    print(
        f"\n{time.perf_counter() - started:.0f} s; wrote {out}/awkward.md, awkward.json, rows.jsonl"
    )


if __name__ == "__main__":
    main()
