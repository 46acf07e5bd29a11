"""Fit, evaluate on held-out programs, and report: the `fit-cost-model` job."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax.records import FitResult, HeldOutScores
from mlirrl_jax.splits import SPLITS_VERSION, SURROGATE_VALIDATION, TEST, TRAIN, suite_of
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import AnalyticModel, CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import Dataset, load_dataset, programs_in_split
from mlirrl_jax.surrogate.metrics import evaluate
from mlirrl_jax.surrogate.train import TrainConfig
from mlirrl_jax.util.plots import pyplot, save_figure

log = logging.getLogger(__name__)


def held_out_metrics(model, data: Dataset) -> tuple[dict, np.ndarray]:
    predicted = predict_dataset(model, data)
    return evaluate(predicted, data.log_time, data.program, data.is_baseline), predicted


def metrics_by_family(predicted: np.ndarray, data: Dataset) -> dict[str, dict]:
    """`evaluate` on the rows of each model family (resnet50, bert, sampled, ...) alone."""
    family = np.array(data.families)[data.program]
    result = {}
    for name in sorted(set(family.tolist())):
        rows = np.flatnonzero(family == name)
        result[name] = evaluate(
            predicted[rows], data.log_time[rows], data.program[rows], data.is_baseline[rows]
        )
    return result


def save_scatter(path: Path, data: Dataset, predicted: dict[str, np.ndarray]) -> Path | None:
    """Predicted vs measured log-speedup of held-out schedules, one panel per model."""
    plt = pyplot()
    base = {p: i for i, p in zip(np.flatnonzero(data.is_baseline), data.program[data.is_baseline])}
    rows = np.array(
        [i for i in range(len(data)) if data.program[i] in base and not data.is_baseline[i]]
    )
    if not len(rows):
        return None
    fig, axes = plt.subplots(1, len(predicted), figsize=(5 * len(predicted), 4.5), squeeze=False)
    for ax, (name, pred) in zip(axes[0], predicted.items()):
        bases = np.array([base[data.program[i]] for i in rows])
        true = data.log_time[bases] - data.log_time[rows]
        guess = pred[bases] - pred[rows]
        ax.scatter(true, guess, s=4, alpha=0.5)
        lo, hi = float(min(true.min(), guess.min())), float(max(true.max(), guess.max()))
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xlabel("measured log speedup")
        ax.set_ylabel("predicted log speedup")
        ax.set_title(name)
    fig.tight_layout()
    return save_figure(fig, path)


REFERENCE_PROGRAMS = 6  # held-out programs whose every row's prediction is kept with a model


def reference_predictions(model, data: Dataset, programs: set[int]) -> dict:
    """The model's prediction of every row of a few held-out programs (the first
    `REFERENCE_PROGRAMS` by name, on each machine and thread count), keyed by program name,
    machine, threads and schedule hash: a small slice of the data that re-predicting checks a
    saved model against drift of features or code."""
    from mlirrl_jax.env.replay import HostState, schedule_of

    names = sorted({data.programs[i].name for i in programs})[:REFERENCE_PROGRAMS]
    part = data.of_programs({i for i in programs if data.programs[i].name in names})
    predicted = predict_dataset(model, part)
    rows = []
    for i in range(len(part)):
        row = int(part.program[i])
        program = part.programs[row]
        state = HostState.from_env_state(jax.tree.map(lambda a, i=i: a[i], part.states))
        rows.append(
            {
                "program": program.name,
                "machine_id": part.machines[row],
                "threads": part.threads[row],
                "schedule_hash": schedule_of(program, state).hash,
                "predicted_log_time": float(predicted[i]),
            }
        )
    return {"programs": sorted({r["program"] for r in rows}), "rows": rows}


def fit_and_report(
    store_path: Path,
    out: Path,
    machine_id: str | list[str],
    config: TrainConfig,
    threads: int | list[int] = 1,
) -> FitResult:
    """Fit on the store's train-split programs, evaluate on its surrogate-validation ones
    (`mlirrl_jax.splits`); test-split programs are left out of both. Several machines or
    thread counts (lists) are fitted together, each program on each one a table row of its
    own (`load_dataset`)."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with MeasurementStore(store_path, create=False) as store:
        data = load_dataset(store, machine_id, threads)
    held = programs_in_split(data, SURROGATE_VALIDATION)
    trained_on = programs_in_split(data, TRAIN)
    train, test = data.of_programs(trained_on), data.of_programs(held)
    excluded = len(data) - len(train) - len(test)
    distinct = lambda rows: len({data.programs[i].name for i in rows})  # noqa: E731
    machines, thread_counts = data.machines_and_threads()
    log.info(
        f"{len(data)} verified measurements of {distinct(range(len(data.programs)))} programs "
        f"on {', '.join(machines)} at {', '.join(map(str, thread_counts))} thread(s) "
        f"({data.skipped} unreadable as a state of the environment); training on {len(train)} rows of "
        f"{distinct(trained_on)} train-split programs, evaluating on {len(test)} rows of "
        f"{distinct(held)} surrogate-validation programs; {excluded} rows of "
        f"{distinct(programs_in_split(data, TEST))} test-split programs left out",
    )
    fit_started = time.perf_counter()
    model, history = CostModel.fit(train, config)
    fit_seconds = time.perf_counter() - fit_started
    model.meta.update(
        held_out_programs=sorted({data.programs[i].name for i in held}),
        splits_version=SPLITS_VERSION,
        suites=sorted({suite_of(data.programs[i].name) or "user" for i in trained_on}),
    )
    metrics, predicted = held_out_metrics(model, test)
    analytic, analytic_predicted = held_out_metrics(AnalyticModel(), test)
    training, _ = held_out_metrics(model, train)
    (out / "model").mkdir(exist_ok=True)
    (out / "model" / "reference_predictions.json").write_text(
        json.dumps(reference_predictions(model, data, held), indent=1)
    )
    model.save(out / "model")  # after the reference predictions: its manifest covers them
    result = FitResult(
        command=" ".join(sys.argv),
        store=str(Path(store_path).resolve()),
        machine_id=model.machine_id,
        machines=machines,
        thread_counts=thread_counts,
        rows=len(data),
        train_rows=len(train),
        held_out_rows=len(test),
        held_out_programs=distinct(held),
        test_rows_left_out=excluded,
        splits_version=SPLITS_VERSION,
        fit_seconds=fit_seconds,
        total_seconds=time.perf_counter() - started,
        surrogate=metrics,
        analytic_baseline=analytic,
        surrogate_by_family=metrics_by_family(predicted, test),
        surrogate_on_training_programs=training,
        history=history,
    )
    (out / "metrics.json").write_text(json.dumps(result.to_json(), indent=1))
    save_scatter(
        out / "predicted_vs_measured.png",
        test,
        {"surrogate": predicted, "analytic baseline": analytic_predicted},
    )
    return result


_COLUMNS = {
    "mape_speedup": "MAPE speedup",
    "spearman": "Spearman",
    "pairwise_accuracy": "pairwise acc.",
    "top1": "top-1",
    "top5": "top-5",
}


def _cells(m: dict) -> list[str]:
    """Formatted metrics; "-" where a metric has nothing to average (only baselines measured)."""
    return [
        "-" if not np.isfinite(m[k]) else f"{m[k]:.1%}" if k == "mape_speedup" else f"{m[k]:.3f}"
        for k in _COLUMNS
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def format_metrics(result: HeldOutScores) -> str:
    """Markdown tables: surrogate and analytic baseline; then the surrogate per family."""
    lines = _table(
        ["model", *_COLUMNS.values()],
        [
            ["surrogate", *_cells(result.surrogate)],
            ["analytic_baseline", *_cells(result.analytic_baseline)],
        ],
    )
    by_family = result.surrogate_by_family
    if by_family:
        lines += [""] + _table(
            ["held-out family", "programs", *_COLUMNS.values()],
            [[name, str(m["programs"]), *_cells(m)] for name, m in by_family.items()],
        )
        if any(not np.isfinite(m[k]) for m in by_family.values() for k in _COLUMNS):
            lines.append(
                '("-": no held-out program of the family has schedules besides its baseline)'
            )
    return "\n".join(lines)


def evaluate_saved(model_dir: Path, dataset_path: Path) -> HeldOutScores:
    """Re-evaluate a saved model on the held-out programs recorded with it.

    `dataset_path` is a measurement store (.db) or a Parquet export of one; the measurements
    must come from the machine the model was trained on.
    """
    import tempfile

    model = CostModel.load(model_dir)
    machine = model.machine_id
    machines = sorted(model.machines)
    threads = list(model.thread_counts) or model.threads
    with tempfile.TemporaryDirectory() as tmp:
        store_path = Path(dataset_path)
        if store_path.suffix == ".parquet":
            store_path = Path(tmp) / "seed.db"
            with MeasurementStore(store_path) as store:
                store.import_parquet(dataset_path, allow_other_machines=True)  # read by id
        with MeasurementStore(store_path, create=False) as store:
            data = load_dataset(store, machines if len(machines) > 1 else machine, threads)
    names = set(model.meta.get("held_out_programs", []))
    held = {i for i, p in enumerate(data.programs) if p.name in names}
    test = data.of_programs(held)
    surrogate, predicted = held_out_metrics(model, test)
    analytic, _ = held_out_metrics(AnalyticModel(), test)
    return HeldOutScores(
        machine_id=machine,
        held_out_programs=len({data.programs[i].name for i in held}),
        held_out_rows=len(test),
        surrogate=surrogate,
        analytic_baseline=analytic,
        surrogate_by_family=metrics_by_family(predicted, test),
    )
