"""The surrogate's update recipes between re-grounding rounds (`RegroundConfig.update`): the
unmeasured anchor states an update learns from beside the measured rows, the trees a residual
update fits, the refusal of an update whose held-back error grew, and the metrics it is judged
by."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from mlirrl_jax.surrogate.api import CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import Dataset, random_states
from mlirrl_jax.surrogate.metrics import evaluate

RESIDUAL_TREES = {
    "objective": "regression",
    "learning_rate": 0.05,
    "num_leaves": 15,
    "min_data_in_leaf": 10,
    "feature_fraction": 0.5,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "deterministic": True,
    "verbose": -1,
}
RESIDUAL_ROUNDS = 150


def anchor_states(
    kind: str, data: Dataset, prior: CostModel, share: float, seed: int
) -> Dataset | None:
    """The unmeasured states an update of `kind` learns from beside `data` (see
    `RegroundConfig.update`): None for "measured"."""
    if kind == "measured" or share <= 0:
        return None
    anchor = random_states(data, max(1, int(share * len(data))), seed=seed)
    anchor.log_time = predict_dataset(prior, anchor)
    if kind == "residual":
        import lightgbm

        from mlirrl_jax.surrogate.teacher import tree_inputs

        inputs, _ = tree_inputs(data.features)
        residual = data.log_time - predict_dataset(prior, data)
        params = {**RESIDUAL_TREES, "seed": seed, "num_threads": os.cpu_count() or 1}
        booster = lightgbm.train(
            params, lightgbm.Dataset(inputs, residual), num_boost_round=RESIDUAL_ROUNDS
        )
        correction = booster.predict(
            tree_inputs(anchor.features)[0], num_threads=params["num_threads"]
        )
        anchor.log_time = (anchor.log_time + correction).astype(np.float32)
    return anchor


def scratch_trees(data: Dataset, exclude: set, seed: int) -> Callable[[Dataset], np.ndarray]:
    """The from-scratch baseline: the teacher's recipe (gradient-boosted trees, as shaped the
    shipped network) fitted on this machine's rows alone, those of `exclude`'s schedules left
    out (baselines kept); returns its predictor of log time."""
    from mlirrl_jax.surrogate.teacher import fit_tree_teacher

    if exclude:
        keep = [
            i
            for i in range(len(data))
            if data.is_baseline[i]
            or (data.programs[data.program[i]].hash, data.schedule_hash[i]) not in exclude
        ]
        data = data.subset(np.asarray(keep, np.int64))
    teacher, _ = fit_tree_teacher(data, SCRATCH_ROUNDS, SCRATCH_LEAVES, seed)
    return lambda rows: teacher.predict(rows.features)


SCRATCH_ROUNDS, SCRATCH_LEAVES = 500, 31  # the teacher's rounds; leaves for ~1,000 rows


def update_refusal(before: dict | None, after: dict | None) -> str | None:
    """Why an update is refused, None if it is kept: its MAPE of speedup on the round's
    held-back rows (programs the update never saw) grew. Without held-back rows to judge by,
    the update is kept."""
    b = (before or {}).get("mape_speedup")
    a = (after or {}).get("mape_speedup")
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    if a > b:
        return f"held-back MAPE of speedup grew from {b:.1%} to {a:.1%}"
    return None


def surrogate_metrics(
    model: CostModel | Callable[[Dataset], np.ndarray],
    data: Dataset | None,
    only: set | None = None,
) -> dict | None:
    """The error on `data` of a surrogate (or of a predictor of log time; on-policy: on the
    rows of `only`'s schedules, each program's baseline kept): MAPE of speedup, Spearman per
    program, pairwise accuracy, and how often its top-1 is the measured top-1."""
    if data is None:
        return None
    if only is not None:
        keep = np.array(
            [
                bool(data.is_baseline[i])
                or (data.programs[data.program[i]].hash, data.schedule_hash[i]) in only
                for i in range(len(data))
            ]
        )
        data = data.subset(np.flatnonzero(keep))
    predicted = predict_dataset(model, data) if isinstance(model, CostModel) else model(data)
    result = evaluate(predicted, data.log_time, data.program, data.is_baseline)
    hits = []
    for p in np.unique(data.program):
        rows = np.flatnonzero((data.program == p) & ~data.is_baseline)
        if len(rows) >= 2:
            hits.append(np.argmin(predicted[rows]) == np.argmin(data.log_time[rows]))
    result["top1_hit"] = float(np.mean(hits)) if hits else math.nan
    result["rows"] = len(data)
    return result
