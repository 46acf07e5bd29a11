"""How well do surrogates rank and time schedules of programs they were never fitted on?

    python bench/surrogate_score.py --store S [--model NAME=DIR ...] [--machine ID]
        [--threads 1,2] [--adapt-store T --adapt-rows 300] [--noise N.json] [--out R.json]

Scores each model on one machine's verified rows of every test-split program in `--store`
(`mlirrl_jax.splits`: the test splits of dl-v0 and shapes-v2, all of awkward-v0; never fitted
on), each thread count alone, with the metrics the surrogate is judged by (`mlirrl_jax.surrogate.metrics`:
per-program Spearman, MAPE of the speedup over the unscheduled run, pairwise accuracy, top-1).
The rows are whatever the store holds: measure random schedules of today's action space into a
store of their own for a clean score (`mlirrl-jax collect --split test --mix random:1`).

- The uncertainty: for a model with an ensemble, the share of the errors above 50% that fall in
  the quarter of predictions with the largest spread (a useless spread holds a quarter).
- `--adapt-store T --adapt-rows N`: each model is also fine-tuned on N verified rows of the
  machine drawn at random from T's train-split programs (N real measurements), the way
  re-grounding updates a surrogate, then scored again: a machine left out of a fit, before
  and after adapting.
- `--noise`: the noise floor (`bench/measurement_noise.py --json`) printed beside the errors.
- `--onpolicy`: on-policy accuracy. The heuristic's schedule and the shipped agent's greedy
  schedule of each test-split program of `--onpolicy-suites` are measured into `--store` at
  each thread count (those not stored yet), and the models are scored on them and the
  baselines alone: the schedules the agent and the heuristic actually go to.

Prints a markdown table; `--out` writes it all as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.splits import TEST, TRAIN, split_of
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import Dataset, load_dataset, map_in_chunks
from mlirrl_jax.surrogate.metrics import evaluate


def programs_of_split(store: MeasurementStore, machine: str, split: str) -> set[str]:
    """Hashes of the store's programs in `split` with verified rows of `machine`."""
    names = {
        r["program_hash"]: r["program_name"] for r in store.rows(machine_id=machine, status="ok")
    }
    return {h for h, name in names.items() if split_of(name) == split}


def predict_with_spread(model, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(predicted log times, their spread across the ensemble: zeros for one network)."""
    if not hasattr(model, "predict_with_spread"):
        return predict_dataset(model, data), np.zeros(len(data))
    both = map_in_chunks(
        lambda s: jnp.stack(model.predict_with_spread(data.table, s), axis=-1),
        data.states,
        size=4096,
    )
    return both[:, 0], both[:, 1]


def speedup_errors(predicted: np.ndarray, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per non-baseline row of a program with a baseline: |predicted / measured speedup - 1|,
    and the rows' indices."""
    errors, rows_of = [], []
    for p in np.unique(data.program):
        rows = np.flatnonzero(data.program == p)
        base = rows[data.is_baseline[rows]]
        if not len(base):
            continue
        others = rows[~data.is_baseline[rows]]
        true = np.exp(data.log_time[base[0]] - data.log_time[others])
        pred = np.exp(predicted[base[0]] - predicted[others])
        errors.append(np.abs(pred / true - 1.0))
        rows_of.append(others)
    if not errors:
        return np.zeros(0), np.zeros(0, int)
    return np.concatenate(errors), np.concatenate(rows_of)


def uncertainty_capture(predicted, spread, data: Dataset, large: float = 0.5) -> float | None:
    """Share of the errors above `large` that fall in the quarter of rows with the largest
    spread (None without a spread or without large errors)."""
    errors, rows = speedup_errors(predicted, data)
    if not len(rows) or not np.any(spread[rows] > 0) or not np.any(errors > large):
        return None
    top = spread[rows] >= np.quantile(spread[rows], 0.75)
    return float(np.sum(top & (errors > large)) / np.sum(errors > large))


def with_enough_rows(data: Dataset, least: int = 3) -> Dataset:
    """The rows of programs with at least `least` rows (a ranking needs a few)."""
    counts = np.bincount(data.program, minlength=len(data.programs))
    return data.of_programs({int(p) for p in np.flatnonzero(counts >= least)})


def measure_onpolicy(store_path: str, machine: str, thread_counts, suites: set[str]) -> dict:
    """Measure the heuristic's and the shipped agent's greedy schedule of every test-split
    program of `suites` with a stored baseline, at each thread count, into the store (what
    it lacks); returns {threads: {"heuristic": hashes, "agent greedy": hashes}}."""
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.measure.runner import Runner
    from mlirrl_jax.schedule import Schedule
    from mlirrl_jax.shipped import SHIPPED_AGENT
    from mlirrl_jax.splits import suite_of

    chosen: dict[int, dict[str, set]] = {}
    with MeasurementStore(store_path) as store:
        programs = {}
        for r in store.rows(machine_id=machine, status="ok"):
            name = r["program_name"]
            if r["schedule_hash"] == Schedule().hash and split_of(name) == TEST:
                if suite_of(name) in suites and r["threads"] in thread_counts:
                    programs.setdefault(r["program_hash"], store.program(r["program_hash"]))
        programs = list(programs.values())
        greedy = Agent.load(SHIPPED_AGENT).scored_schedules(programs, n=1)
        stored = {
            (r["program_hash"], r["schedule_hash"], r["threads"])
            for r in store.rows(machine_id=machine)
        }
        work = []
        for t in thread_counts:
            chosen[t] = {"heuristic": set(), "agent greedy": set()}
            for p, g in zip(programs, greedy, strict=True):
                for kind, schedule in (
                    ("heuristic", heuristic_schedule(p, threads=t)),
                    ("agent greedy", g[0].schedule),
                ):
                    if schedule.is_empty:
                        continue
                    chosen[t][kind].add(schedule.hash)
                    if (p.hash, schedule.hash, t) not in stored:
                        stored.add((p.hash, schedule.hash, t))
                        work.append((p, schedule, t))
        started = time.perf_counter()
        with Runner() as runner:
            for i, (p, schedule, t) in enumerate(work):
                store.put([runner.measure(p, schedule, threads=t)])
                if (i + 1) % 20 == 0 or i + 1 == len(work):
                    rate = (i + 1) / (time.perf_counter() - started)
                    print(
                        f"  on-policy: {i + 1}/{len(work)} measured, {rate:.2f}/s, "
                        f"ETA {(len(work) - i - 1) / rate:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return chosen


def rows_of(data: Dataset, hashes: set) -> Dataset:
    """The rows of these schedule hashes, with the baselines of their programs."""
    mine = np.isin(data.schedule_hash, list(hashes)) & ~data.is_baseline
    programs = np.unique(data.program[mine])
    keep = mine | (data.is_baseline & np.isin(data.program, programs))
    return data.subset(np.flatnonzero(keep))


def score(model, data: Dataset) -> dict:
    predicted, spread = predict_with_spread(model, data)
    metrics = evaluate(predicted, data.log_time, data.program, data.is_baseline)
    metrics["uncertainty_capture"] = uncertainty_capture(predicted, spread, data)
    return metrics


def adapted(
    model,
    store: MeasurementStore,
    machine: str,
    threads: list[int],
    rows: int,
    seed,
    trainable: str = "all",
):
    """`model` fine-tuned on `rows` verified rows of `machine`, drawn at random from the
    train-split programs of `store` (each with its baseline), at `threads`, the way
    re-grounding updates it (`RegroundConfig`'s default recipe: its epochs, and random states
    labeled by the prior corrected by small trees fitted to the prior's errors on the rows);
    `trainable="head"`: the output layers only."""
    from mlirrl_jax.regrounding import RegroundConfig, anchor_states

    recipe = RegroundConfig()
    data = load_dataset(store, machine, threads, programs_of_split(store, machine, TRAIN))
    rng = np.random.default_rng(seed)
    picked = data.subset(np.sort(rng.choice(len(data), size=min(rows, len(data)), replace=False)))
    anchor = anchor_states(recipe.update, picked, model, recipe.anchor_share, seed)
    return model.update(
        picked,
        recipe.update_epochs,
        machine_id=machine,
        anchor=anchor,
        note=f"{len(picked)} rows of {machine}",
        threads=threads[0],
        trainable=trainable,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="store with the rows to score on")
    parser.add_argument("--model", action="append", required=True, help="NAME=DIR or DIR")
    parser.add_argument("--machine", default=None, help="machine id (default: this one)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--adapt-store", default=None)
    parser.add_argument("--adapt-rows", type=int, default=300)
    parser.add_argument("--noise", default=None, help="JSON of bench/measurement_noise.py")
    parser.add_argument("--onpolicy", action="store_true")
    parser.add_argument("--onpolicy-suites", default="dl-v0,awkward-v0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    machine = args.machine or machine_fingerprint()["machine_id"]
    thread_counts = [int(t) for t in args.threads.split(",")]
    models = {}
    for spec in args.model:
        name, _, path = spec.rpartition("=")
        models[name or Path(path).name] = CostModel.load(path)
    noise = json.loads(Path(args.noise).read_text()) if args.noise else {}
    results = []
    started = time.perf_counter()
    onpolicy = {}
    if args.onpolicy:
        onpolicy = measure_onpolicy(
            args.store, machine, thread_counts, set(args.onpolicy_suites.split(","))
        )
    with MeasurementStore(args.store, create=False) as store:
        test = programs_of_split(store, machine, TEST)
        loaded = {t: load_dataset(store, machine, t, test) for t in thread_counts}
    # random schedules: the rows the on-policy step did not add
    policy_hashes = {
        t: set().union(*onpolicy[t].values()) if t in onpolicy else set() for t in thread_counts
    }
    data = {
        (t, "random"): with_enough_rows(
            loaded[t].subset(
                np.flatnonzero(~np.isin(loaded[t].schedule_hash, list(policy_hashes[t])))
            )
        )
        for t in thread_counts
    }
    for t, kinds in onpolicy.items():
        for kind, hashes in kinds.items():
            data[t, kind] = rows_of(loaded[t], hashes)
    adapt = MeasurementStore(args.adapt_store, create=False) if args.adapt_store else None
    for name, model in models.items():
        variants = [(name, model)]
        if adapt is not None:
            tuned = adapted(model, adapt, machine, thread_counts, args.adapt_rows, args.seed)
            variants.append((f"{name} + {args.adapt_rows} rows", tuned))
        for label, m in variants:
            for (t, kind), d in data.items():
                results.append({"model": label, "threads": t, "schedules_of": kind, **score(m, d)})
                print(f"  scored {label} at {t} thread(s) on {kind}", file=sys.stderr, flush=True)
    print(f"\nmachine {machine}, store {args.store}, test-split programs only")
    print(
        "| model | threads | schedules of | programs | schedules | Spearman | MAPE speedup "
        "| pairwise | top-1 | top-1 hit | large errors in top-spread quarter "
        "| noise floor MAPE / Spearman |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        floor = noise.get(str(r["threads"]), {})
        capture = r["uncertainty_capture"]
        print(
            f"| {r['model']} | {r['threads']} | {r['schedules_of']} | {r['programs']} | "
            f"{r['schedules']} | "
            f"{r['spearman']:.3f} | {r['mape_speedup']:.1%} | {r['pairwise_accuracy']:.3f} | "
            f"{r['top1']:.3f} | {r['top1_hit']:.2f} | "
            f"{'-' if capture is None else f'{capture:.0%}'} | "
            f"{floor.get('mape_speedup', float('nan')):.1%} / {floor.get('spearman', float('nan')):.3f} |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"machine": machine, "store": args.store, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
