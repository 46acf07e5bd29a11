"""Collection throughput and where a measurement's time goes, for several job settings in one run.

    python bench/bench_collect.py --out bench/results/collect-b97c [--suite shapes-v2]
        [--programs 24] [--rows 300] [--configs plain-pinned,plain,gated]
        [--noise-programs 12] [--noise-per-program 8]

Each setting runs a real collection (sampling, compiling, verifying, timing, committing to a
fresh SQLite store `OUT/SETTING.db` (kept, not checked in), with a reference cache of its own,
so that no setting reads references another computed) over the same train programs and seed, so every setting measures
the same schedules in the same order. Settings:

- plain-pinned: one worker pinned to core 0 and full timing (at least 0.1 s per kernel), the
  job on the other cores (how a quiet collection ran before the gate);
- plain: the old default, `--workers` workers, no gate, full timing, every core measuring;
- gated-full: `--workers` gated workers (one kernel timed at a time, `measure.gate`), full timing;
- gated: gated workers and adaptive repeats (today's default `collect`).

For each: verified rows per second over the whole job (start-up included), and the mean
seconds per measurement of each phase (transform, lower, JIT, reference, first call, verify,
timed repeats, waiting for the gate, and the rest: the worker's round trip); the job's own
seconds drawing schedules. Then the noise floor of each store (`measurement_noise.noise_at`:
a sample of its rows measured again alone, one worker, full timing) and, across settings, how
the same schedules' times agree between stores. Writes OUT/collect.json and OUT/collect.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from measurement_noise import noise_at

from mlirrl_jax.collect import CollectConfig, CollectionJob
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.refcache import CACHE_ENV
from mlirrl_jax.measure.timing import ADAPTIVE, TimingMethod
from mlirrl_jax.store import MeasurementStore

PHASES = (
    "transform_s",
    "lower_s",
    "jit_s",
    "reference_s",
    "first_call_s",
    "verify_s",
    "timing_s",
    "gate_wait_s",
)


def settings(workers: int) -> dict[str, dict]:
    full = TimingMethod()
    return {
        "plain-pinned": dict(workers=1, measure_cpus=(0,), gate=False, method=full),
        "plain": dict(workers=workers, gate=False, method=full),
        "gated-full": dict(workers=workers, gate=True, method=full),
        "gated": dict(workers=workers, gate=True, method=ADAPTIVE),
    }


def run_setting(name: str, base: CollectConfig, overrides: dict, out: Path, cache: Path) -> dict:
    """One collection job of setting `name`, with a reference cache of its own under `cache`;
    its rate and mean phase seconds."""
    os.environ[CACHE_ENV] = str(cache / name)
    config = replace(base, store=out / f"{name}.db", **overrides)
    config.store.unlink(missing_ok=True)
    phases: list[dict] = []
    sampling = [0.0]

    def record(task, measurement) -> None:
        if measurement.ok and not task.schedule.is_empty:
            phases.append(
                {
                    **measurement.compile_s,
                    **measurement.phase_s,
                    "wall_s": measurement.wall_s,
                    "repeats": measurement.repeats,
                }
            )

    started = time.perf_counter()
    job = CollectionJob(config)
    draw = job.tasks

    def timed_tasks():
        tasks = draw()
        while True:
            begun = time.perf_counter()
            task = next(tasks, None)
            sampling[0] += time.perf_counter() - begun
            if task is None:
                return
            yield task

    job.tasks = timed_tasks
    report = job.run(on_result=record)
    wall = time.perf_counter() - started
    verified = report.by_status.get("ok", 0)
    means = {k: statistics.fmean(p.get(k, 0.0) for p in phases) for k in PHASES} if phases else {}
    mean_wall = statistics.fmean(p["wall_s"] for p in phases) if phases else 0.0
    print(
        f"{name}: {report.measured} measured ({verified} verified) in {wall:.0f} s: "
        f"{verified / wall:.2f} verified rows/s; {report.by_status}",
        flush=True,
    )
    return {
        "setting": name,
        "workers": config.workers,
        "gate": config.gate,
        "method": "adaptive" if config.method.converged_spread else "full",
        "measured": report.measured,
        "verified": verified,
        "wall_s": wall,
        "rows_per_s": verified / wall,
        "by_status": report.by_status,
        "sampling_s": sampling[0],
        "scheduled_rows": len(phases),
        "mean_wall_s": mean_wall,
        "mean_phase_s": means,
        "mean_other_s": mean_wall - sum(means.values()) if phases else 0.0,
        "mean_repeats": statistics.fmean(p["repeats"] for p in phases) if phases else 0.0,
    }


def agreement(out: Path, names: list[str], machine: str, threads: int) -> dict:
    """Per pair of settings: the median |log time ratio| of the schedules both stores hold."""
    times = {}
    for name in names:
        with MeasurementStore(out / f"{name}.db", create=False) as store:
            times[name] = {
                (r["program_hash"], r["schedule_hash"]): r["median_s"]
                for r in store.rows(machine_id=machine, status="ok")
                if r["threads"] == threads
            }
    pairs = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            common = sorted(set(times[a]) & set(times[b]))
            ratios = [abs(np.log(times[a][k] / times[b][k])) for k in common]
            if ratios:
                pairs[f"{a} vs {b}"] = {
                    "rows": len(ratios),
                    "median_abs_log_ratio": float(np.median(ratios)),
                    "p90_abs_log_ratio": float(np.percentile(ratios, 90)),
                }
    return pairs


def markdown(result: dict) -> str:
    lines = [
        f"Machine {result['machine']} ({result['cores']} cores), {result['date']}: "
        f"{result['programs']} {result['suite']} train programs, {result['rows']} rows per "
        f"setting, {result['threads']} thread(s) per kernel, seed {result['seed']}.",
        "",
        "| setting | workers | gate | repeats | verified rows | wall s | verified rows/s | "
        "x plain-pinned | x plain | mean repeats |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = {r["setting"]: r for r in result["runs"]}
    for r in result["runs"]:
        rel = [
            f"{r['rows_per_s'] / runs[k]['rows_per_s']:.2f}x" if k in runs else "-"
            for k in ("plain-pinned", "plain")
        ]
        lines.append(
            f"| {r['setting']} | {r['workers']} | {'on' if r['gate'] else 'off'} | {r['method']} "
            f"| {r['verified']} | {r['wall_s']:.0f} | {r['rows_per_s']:.2f} | {rel[0]} | {rel[1]} "
            f"| {r['mean_repeats']:.0f} |"
        )
    lines += [
        "",
        "Where a scheduled measurement's time goes (mean seconds per verified row; the rest is "
        "the worker's round trip; sampling is the job's own time drawing schedules, in total):",
        "",
        "| setting | " + " | ".join(p.removesuffix("_s") for p in PHASES) + " | rest | wall | "
        "sampling (job, total s) |",
        "|---|" + "---|" * (len(PHASES) + 3),
    ]
    for r in result["runs"]:
        cells = [f"{r['mean_phase_s'].get(p, 0.0):.3f}" for p in PHASES]
        lines.append(
            f"| {r['setting']} | " + " | ".join(cells) + f" | {r['mean_other_s']:.3f} | "
            f"{r['mean_wall_s']:.3f} | {r['sampling_s']:.0f} |"
        )
    lines += [
        "",
        "Noise floor: each store's rows measured again alone (one worker, full timing), "
        "scored as a cost model would be:",
        "",
        "| setting | rows | median abs log ratio | p90 | MAPE speedup | Spearman | pairwise |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in result["noise"].items():
        lines.append(
            f"| {name} | {m['rows']} | {m['median_abs_log_ratio']:.3f} | "
            f"{m['p90_abs_log_ratio']:.3f} | {m['mape_speedup']:.1%} | {m['spearman']:.3f} | "
            f"{m['pairwise_accuracy']:.3f} |"
        )
    lines += ["", "The same schedules in two stores:", ""]
    lines += ["| settings | rows | median abs log ratio | p90 |", "|---|---|---|---|"]
    for pair, m in result["agreement"].items():
        lines.append(
            f"| {pair} | {m['rows']} | {m['median_abs_log_ratio']:.3f} | "
            f"{m['p90_abs_log_ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for the stores and the report")
    parser.add_argument("--suite", default="shapes-v2")
    parser.add_argument("--programs", type=int, default=24, help="the split's first N programs")
    parser.add_argument("--rows", type=int, default=300, help="rows per setting")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--configs", default="plain-pinned,plain,gated-full,gated")
    parser.add_argument("--noise-programs", type=int, default=12)
    parser.add_argument("--noise-per-program", type=int, default=8)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.configs.split(",")
    known = settings(args.workers)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {list(known)}")
    base = CollectConfig(
        suite=args.suite,
        budget=args.rows,
        threads=args.threads,
        seed=args.seed,
        max_programs=args.programs,
        baselines_of=("train",),
        timeout_s=30.0,
    )
    machine = machine_fingerprint()["machine_id"]
    with tempfile.TemporaryDirectory(prefix="bench-collect-refs-") as cache:
        runs = [run_setting(name, base, known[name], out, Path(cache)) for name in names]
    noise_args = argparse.Namespace(
        seed=0, programs=args.noise_programs, per_program=args.noise_per_program
    )
    noise = {}
    for name in names:
        figures = noise_at(str(out / f"{name}.db"), args.threads, noise_args, machine)
        if figures is not None:
            noise[name] = figures
    result = {
        "machine": machine,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "suite": args.suite,
        "programs": args.programs,
        "rows": args.rows,
        "threads": args.threads,
        "seed": args.seed,
        "runs": runs,
        "noise": noise,
        "agreement": agreement(out, names, machine, args.threads),
    }
    (out / "collect.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (out / "collect.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
