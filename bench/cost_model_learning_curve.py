"""How the surrogate's held-out accuracy grows with the number of training programs.

    python bench/cost_model_learning_curve.py --store data/measurements.db
        [--fractions 0.125,0.25,0.5,1] [--seeds 2] [--teacher none] [--epochs N]
        [--max-steps N] [--out DIR]

The held-out programs are the surrogate-validation split (`mlirrl_jax.splits`); the training
programs are a random share of the train split (`--fractions`, each with `--seeds` draws, all
of their rows), and each share trains a fresh surrogate with the default `TrainConfig` (one
network, no distillation, unless `--teacher` names one). Prints one row per fit, then the
median per share and, per metric, the change per doubling of training programs (least squares
over log2 programs) with the programs a straight-line extrapolation would need to reach the
surrogate's targets. Writes `learning_curve.json` and `learning_curve.png` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.splits import SURROGATE_VALIDATION, TRAIN
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import load_dataset, programs_in_split
from mlirrl_jax.surrogate.metrics import evaluate
from mlirrl_jax.surrogate.train import TrainConfig

# metric: (target, higher is better)
TARGETS = {
    "mape_speedup": (0.15, False),
    "spearman": (0.85, True),
    "pairwise_accuracy": (0.85, True),
    "top1": (0.9, True),
}


def _trend(programs: list[int], values: list[float], target: float) -> tuple[float, float]:
    """Least-squares line of `values` over log2 `programs`: (change per doubling, programs at
    which the line reaches `target`; inf if it never does)."""
    slope, intercept = np.polyfit(np.log2(programs), values, 1)
    if slope == 0:
        return 0.0, float("inf")
    needed = 2.0 ** ((target - intercept) / slope)
    return float(slope), float(needed) if needed > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default="data/measurements.db")
    parser.add_argument("--machine", default=None, help="machine id (default: this machine)")
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--teacher", default="none", help="trees, networks or none")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="cap on batches per fit (default 0: none, so every share gets the same epochs)",
    )
    parser.add_argument("--out", default="runs/learning-curve")
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    if any(not 0 < f <= 1 for f in fractions):
        parser.error(f"--fractions must lie in (0, 1]: {args.fractions}")
    machine = args.machine or machine_fingerprint()["machine_id"]
    data = load_dataset(MeasurementStore(args.store, create=False), machine)
    train = data.of_programs(programs_in_split(data, TRAIN))
    test = data.of_programs(programs_in_split(data, SURROGATE_VALIDATION))
    train_programs = np.unique(train.program)
    cap = args.max_steps or None
    config = replace(TrainConfig(), teacher=args.teacher, max_steps=cap, distill_max_steps=cap)
    if args.epochs:
        config = replace(config, epochs=args.epochs)
    print(
        f"{len(train_programs)} training programs ({len(train)} rows), "
        f"{len(np.unique(test.program))} held-out programs ({len(test)} rows); "
        f"{config.epochs} epochs (at most {config.max_steps or 'any number of'} batches), "
        f"teacher {config.teacher}"
    )
    header = f"{'share':>6} {'seed':>4} {'programs':>8} {'rows':>6} {'fit s':>6}  " + " ".join(
        f"{m:>17}" for m in TARGETS
    )
    print(header)
    runs = []
    for fraction in fractions:
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, int(fraction * 1e6)])
            count = max(2, int(round(fraction * len(train_programs))))
            chosen = rng.choice(train_programs, size=count, replace=False)
            part = train.subset(np.flatnonzero(np.isin(train.program, chosen)))
            started = time.perf_counter()
            model, _ = CostModel.fit(part, replace(config, seed=seed))
            fit_s = time.perf_counter() - started
            metrics = evaluate(
                predict_dataset(model, test), test.log_time, test.program, test.is_baseline
            )
            runs.append(
                {"share": fraction, "seed": seed, "programs": count, "rows": len(part)}
                | {"fit_s": fit_s}
                | {m: metrics[m] for m in TARGETS}
            )
            r = runs[-1]
            print(
                f"{fraction:6.3f} {seed:4d} {count:8d} {len(part):6d} {fit_s:6.0f}  "
                + " ".join(f"{r[m]:17.3f}" for m in TARGETS),
                flush=True,
            )
    medians = []
    for fraction in fractions:
        rows = [r for r in runs if r["share"] == fraction]
        medians.append(
            {"share": fraction, "programs": rows[0]["programs"]}
            | {m: statistics.median(r[m] for r in rows) for m in TARGETS}
        )
    print("\nmedian per share")
    for m in medians:
        print(
            f"{m['share']:6.3f} {'':4} {m['programs']:8d} {'':6} {'':6}  "
            + " ".join(f"{m[k]:17.3f}" for k in TARGETS)
        )
    programs = [r["programs"] for r in runs]
    trend = {}
    print(f"\n{'metric':>17} {'per doubling':>13} {'target':>7} {'programs to reach it':>21}")
    for metric, (target, _) in TARGETS.items():
        values = [r[metric] for r in runs]
        slope, needed = _trend(programs, values, target)
        trend[metric] = {"per_doubling": slope, "target": target, "programs_needed": needed}
        shown = f"{needed:,.0f}" if np.isfinite(needed) else "never (flat or worse)"
        print(f"{metric:>17} {slope:+13.4f} {target:7.2f} {shown:>21}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "machine_id": machine,
        "train": config.to_json(),
        "held_out_rows": len(test),
        "runs": runs,
        "medians": medians,
        "trend": trend,
    }
    (out / "learning_curve.json").write_text(json.dumps(report, indent=2))
    _plot(runs, out / "learning_curve.png")
    print(f"\nwrote {out / 'learning_curve.json'} and {out / 'learning_curve.png'}")


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TARGETS), figsize=(4 * len(TARGETS), 3.4))
    for ax, (metric, (target, _)) in zip(axes, TARGETS.items()):
        ax.scatter([r["programs"] for r in runs], [r[metric] for r in runs], s=14)
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label="target")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training programs")
        ax.set_title(metric)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
