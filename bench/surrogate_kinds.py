"""Which kind of surrogate ranks and times schedules of unseen programs best? One split, every kind.

    python bench/surrogate_kinds.py --train-store S [--machines all] [--leave-out ID]
        --score ID=STORE [--score ID=STORE ...] [--threads 1,2]
        [--kinds trees,trees-rank,net,net-mse,net-listwise,distilled,tokens]
        [--max-steps N] [--adapt-rows 300] --out DIR

Every kind is fitted on the same rows: the verified rows of the train-split programs
(`mlirrl_jax.splits`) of `--machines` in `--train-store`, at `--threads`, less the machine
`--leave-out` names (a machine never seen). Each is scored on the test-split programs (never
fitted on) of each `--score` machine, read from its store, per thread count, with the metrics
the surrogate is judged by (`mlirrl_jax.surrogate.metrics`), programs with at least 3 rows.

The kinds:
- trees: gradient-boosted trees on the flattened features (squared log time per point); the
  distillation teacher, a ceiling: they cannot run under `jit`.
- trees-rank: the same trees with LightGBM's LambdaRank objective, one query per program
  (a ranking only: no speedup error).
- net: the network alone (`teacher="none"`), squared log time plus the within-program
  difference and pairwise logistic losses (the shipped losses).
- net-mse: the network on squared log time alone.
- net-listwise: `net` plus a listwise (ListNet) ranking loss.
- distilled: the shipped recipe, the network distilled from the trees.
- tokens: the TLP-like model of `mlirrl_jax.surrogate.tokens` (the schedule as transformation
  tokens, attention over the steps, no engineered features), the shipped losses.

The uncertainty of each kind is scored two ways: an ensemble's spread where it has one, and
its disagreement with the trees (|its log time - the trees'|): the share of the speedup errors
above 50% that fall in the quarter of rows where either is largest. `--adapt-rows N`: with
`--leave-out`, each network kind is also fine-tuned on N random verified rows of the left-out
machine's train-split programs in `--train-store` (re-grounding's update recipe: every
weight, or only the output layers, `--adapt-recipes`) and scored again.

Writes `kinds.json`, `kinds.md` and `kinds.png` (Spearman and MAPE per kind and machine) under
`--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from surrogate_score import (  # noqa: E402
    adapted,
    programs_of_split,
    speedup_errors,
    with_enough_rows,
)

from mlirrl_jax.splits import TEST, TRAIN  # noqa: E402
from mlirrl_jax.store import MeasurementStore  # noqa: E402
from mlirrl_jax.surrogate.api import CostModel  # noqa: E402
from mlirrl_jax.surrogate.dataset import Dataset, load_dataset, map_in_chunks  # noqa: E402
from mlirrl_jax.surrogate.metrics import evaluate  # noqa: E402
from mlirrl_jax.surrogate.model import ModelConfig, apply_members  # noqa: E402
from mlirrl_jax.surrogate.teacher import fit_tree_teacher, tree_inputs, tree_params  # noqa: E402
from mlirrl_jax.surrogate.tokens import TokenConfig, build_tokens, tokens_of_states  # noqa: E402
from mlirrl_jax.surrogate.train import TrainConfig, fit  # noqa: E402

KINDS = ("trees", "trees-rank", "net", "net-mse", "net-listwise", "distilled", "tokens")
NETWORK_KINDS = {"net", "net-mse", "net-listwise", "distilled"}
RECIPES = {"all": "all", "head": "head"}


def network_config(kind: str, max_steps: int, members: int, seed: int) -> TrainConfig:
    base = TrainConfig(
        seed=seed,
        teacher="none",
        max_steps=max_steps,
        distill_max_steps=max_steps,
        model=ModelConfig(members=members, seed=seed),
    )
    return {
        "net": base,
        "net-mse": replace(base, difference_weight=0.0, rank_weight=0.0),
        "net-listwise": replace(base, listwise_weight=1.0),
        "distilled": replace(base, teacher="trees"),
        "tokens": base,
    }[kind]


class Trees:
    """Boosted trees (regression) behind the scoring interface."""

    def __init__(self, teacher):
        self.teacher = teacher

    def predict(self, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
        return self.teacher.predict(data.features), np.zeros(len(data))


class RankTrees:
    """LambdaRank trees: a score per schedule, higher = predicted faster; returned negated, so
    that it orders as a log time (and means nothing as one)."""

    def __init__(self, data: Dataset, rounds: int, leaves: int, seed: int):
        import lightgbm

        order = np.argsort(data.program, kind="stable")
        inputs, _ = tree_inputs(data.features)
        program = data.program[order]
        # relevance: each program's schedules in up to 31 grades, fastest highest
        grades = np.zeros(len(order), np.int32)
        for p in np.unique(program):
            rows = np.flatnonzero(program == p)
            ranks = np.argsort(np.argsort(-data.log_time[order][rows]))
            grades[rows] = np.floor(30 * ranks / max(len(rows) - 1, 1)).astype(np.int32)
        _, counts = np.unique(program, return_counts=True)
        train = lightgbm.Dataset(inputs[order], grades, group=counts, free_raw_data=True)
        params = tree_params(leaves, seed, objective="lambdarank")
        self.booster = lightgbm.train(params, train, num_boost_round=rounds)

    def predict(self, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
        inputs, _ = tree_inputs(data.features)
        score = self.booster.predict(inputs, num_threads=os.cpu_count() or 1)
        return -score.astype(np.float32), np.zeros(len(data))


class Network:
    """A fitted network (features) as a `CostModel`."""

    def __init__(self, model: CostModel):
        self.model = model
        # compiled once per model; each scoring set reuses it
        self.members = jax.jit(lambda f: apply_members(model.graphdef, model.params, f).T)

    def predict(self, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
        members = map_in_chunks(self.members, data.features, size=4096)  # (rows, members)
        return members.mean(axis=1), members.std(axis=1)


class TokenModel:
    """The token network behind the scoring interface."""

    def __init__(self, graphdef, params):
        from flax import nnx

        self.graphdef, self.params = graphdef, params
        # compiled once per model; each scoring set reuses it
        self.members = jax.jit(lambda t: jax.vmap(lambda p: nnx.merge(graphdef, p)(t))(params).T)

    def predict(self, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
        toks = tokens_of_states(data.table, data.states)
        members = map_in_chunks(self.members, toks, size=4096)
        return members.mean(axis=1), members.std(axis=1)


def fit_kind(kind: str, data: Dataset, args) -> tuple[object, float]:
    started = time.perf_counter()
    if kind == "trees":
        teacher, _ = fit_tree_teacher(data, args.rounds, args.leaves, args.seed)
        model = Trees(teacher)
    elif kind == "trees-rank":
        model = RankTrees(data, args.rounds, args.leaves, args.seed)
    elif kind == "tokens":
        config = network_config(kind, args.max_steps, args.members, args.seed)
        init = build_tokens(TokenConfig(members=args.members, seed=args.seed))
        toks = tokens_of_states(data.table, data.states)
        graphdef, params, _ = fit(replace(data, features=toks), config, init=init)
        model = TokenModel(graphdef, params)
    else:
        config = network_config(kind, args.max_steps, args.members, args.seed)
        model = Network(CostModel.fit(data, config)[0])
    return model, time.perf_counter() - started


def capture(errors_rows, signal: np.ndarray, large: float = 0.5) -> float | None:
    """Share of the speedup errors above `large` in the quarter of rows where `signal` is
    largest (None without errors that large or without a signal)."""
    errors, rows = errors_rows
    if not len(rows) or not np.any(errors > large) or not np.any(signal[rows] > 0):
        return None
    top = signal[rows] >= np.quantile(signal[rows], 0.75)
    return float(np.sum(top & (errors > large)) / np.sum(errors > large))


def score_all(models: dict, sets: dict, ranking_only: set) -> list[dict]:
    results = []
    for (machine, threads), data in sets.items():
        predictions = {name: m.predict(data) for name, m in models.items()}
        trees = predictions.get("trees", (None, None))[0]
        for name, (predicted, spread) in predictions.items():
            metrics = evaluate(predicted, data.log_time, data.program, data.is_baseline)
            errors_rows = speedup_errors(predicted, data)
            if name in ranking_only:
                metrics["mape_speedup"] = float("nan")
            metrics["spread_capture"] = capture(errors_rows, spread)
            metrics["disagreement_capture"] = (
                None
                if trees is None or name == "trees" or name in ranking_only
                else capture(errors_rows, np.abs(predicted - trees))
            )
            results.append({"kind": name, "machine": machine, "threads": threads, **metrics})
    return results


def throughput(model, data: Dataset, repeats: int = 20, batch: int = 4096) -> float | None:
    """Predictions per second of a jit-able kind on `batch` of `data`'s states, features or
    tokens included (median of `repeats`); None for trees."""
    if not isinstance(model, Network | TokenModel):
        return None
    rows = np.resize(np.arange(len(data)), batch)
    states = jax.tree.map(lambda a: jax.numpy.asarray(a[rows]), data.states)
    if isinstance(model, Network):
        run = jax.jit(lambda s: model.model.predict(data.table, s))
    else:
        from flax import nnx

        from mlirrl_jax.surrogate.tokens import tokens

        def run_tokens(s):
            t = jax.vmap(tokens, in_axes=(None, 0))(data.table, s)
            return jax.vmap(lambda p: nnx.merge(model.graphdef, p)(t))(model.params).mean(0)

        run = jax.jit(run_tokens)
    run(states).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(states).block_until_ready()
        times.append(time.perf_counter() - start)
    return batch / float(np.median(times))


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["machine"][:4], r["threads"]) for r in results})
    kinds = list(dict.fromkeys(r["kind"] for r in results))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        for ax, metric in zip(axes, ("spearman", "mape_speedup"), strict=True):
            values = [
                next(
                    (
                        r[metric]
                        for r in results
                        if (r["machine"][:4], r["threads"]) == g and r["kind"] == kind
                    ),
                    np.nan,
                )
                for g in groups
            ]
            ax.bar(np.arange(len(groups)) + i * width, values, width, label=kind)
    for ax, title in zip(
        axes, ("Spearman per program (higher is better)", "MAPE of speedup"), strict=True
    ):
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{m} {t}t" for m, t in groups])
        ax.set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(kinds), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-store", required=True)
    parser.add_argument("--machines", default="all")
    parser.add_argument("--leave-out", default=None, help="a machine id left out of the fit")
    parser.add_argument("--score", action="append", required=True, help="MACHINE=STORE")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--max-steps", type=int, default=8000)
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--leaves", type=int, default=127)
    parser.add_argument("--adapt-rows", type=int, default=0)
    parser.add_argument(
        "--adapt-recipes",
        default="all,head",
        help="few-shot recipes: all (every weight, re-grounding's update), head (the output "
        "layers only: a head of the machine's own over the shared layers)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; expected some of {', '.join(KINDS)}")
    threads = [int(t) for t in args.threads.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with MeasurementStore(args.train_store, create=False) as store:
        machines = sorted(store.machines()) if args.machines == "all" else args.machines.split(",")
        machines = [m for m in machines if m != args.leave_out]
        train_programs = set().union(*(programs_of_split(store, m, TRAIN) for m in machines))
        data = load_dataset(store, machines, threads, train_programs)
    print(
        f"training rows: {len(data)} of {len(train_programs)} programs, machines "
        f"{', '.join(machines)}, threads {threads} ({time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    sets = {}
    for spec in args.score:
        machine, _, path = spec.partition("=")
        with MeasurementStore(path, create=False) as store:
            test = programs_of_split(store, machine, TEST)
            for t in threads:
                try:
                    loaded = load_dataset(store, machine, t, test)
                except Exception as error:  # no rows at this thread count
                    print(f"  {machine} at {t} thread(s): {error}", flush=True)
                    continue
                sets[machine, t] = with_enough_rows(loaded)
                print(
                    f"  scoring set {machine} {t}t: {len(sets[machine, t])} rows of "
                    f"{len(np.unique(sets[machine, t].program))} programs",
                    flush=True,
                )
    models, fit_seconds, speed = {}, {}, {}
    for kind in kinds:
        models[kind], fit_seconds[kind] = fit_kind(kind, data, args)
        speed[kind] = throughput(models[kind], data)
        print(
            f"  {kind}: fitted in {fit_seconds[kind]:.0f} s"
            + (f", {speed[kind]:,.0f} predictions/s" if speed[kind] else ""),
            flush=True,
        )
    results = score_all(models, sets, ranking_only={"trees-rank"})
    if args.leave_out and args.adapt_rows:
        recipes = args.adapt_recipes.split(",")
        with MeasurementStore(args.train_store, create=False) as store:
            tuned = {
                f"{k} + {args.adapt_rows} rows ({recipe})": Network(
                    adapted(
                        models[k].model,
                        store,
                        args.leave_out,
                        threads,
                        args.adapt_rows,
                        args.seed,
                        trainable=RECIPES[recipe],
                    )
                )
                for k in kinds
                if k in NETWORK_KINDS
                for recipe in recipes
            }
        left = {k: v for k, v in sets.items() if k[0] == args.leave_out}
        results += score_all(tuned, left, ranking_only=set())
    lines = [
        f"train: {len(data)} rows of {len(train_programs)} programs on {', '.join(machines)}"
        + (f"; left out: {args.leave_out}" if args.leave_out else ""),
        "",
        "| kind | machine | threads | programs | schedules | Spearman | MAPE speedup | pairwise "
        "| top-1 | top-1 hit | large errors: top-spread quarter / top-disagreement quarter |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    for r in results:
        mape = "-" if np.isnan(r["mape_speedup"]) else f"{r['mape_speedup']:.1%}"
        lines.append(
            f"| {r['kind']} | {r['machine']} | {r['threads']} | {r['programs']} | "
            f"{r['schedules']} | {r['spearman']:.3f} | {mape} | {r['pairwise_accuracy']:.3f} | "
            f"{r['top1']:.3f} | {r['top1_hit']:.2f} | {pct(r['spread_capture'])} / "
            f"{pct(r['disagreement_capture'])} |"
        )
    lines += ["", "| kind | fit s | predictions/s (batch 4,096, 2 cores) |", "|---|---|---|"]
    for kind in kinds:
        rate = f"{speed[kind]:,.0f}" if speed[kind] else "- (not jit-able)"
        lines.append(f"| {kind} | {fit_seconds[kind]:.0f} | {rate} |")
    text = "\n".join(lines)
    print(text)
    (out / "kinds.md").write_text(text + "\n")
    (out / "kinds.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "train_rows": len(data),
                "train_programs": len(train_programs),
                "machines": machines,
                "fit_seconds": fit_seconds,
                "predictions_per_second": speed,
                "results": results,
            },
            indent=1,
        )
    )
    plot(results, out / "kinds.png")
    print(f"{time.perf_counter() - started:.0f} s; {out / 'kinds.md'}, kinds.json, kinds.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
