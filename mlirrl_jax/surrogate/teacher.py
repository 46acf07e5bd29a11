"""The distillation teacher: gradient-boosted trees (LightGBM) on the flattened features.

On these features a tree ensemble generalizes to unseen programs better than a network of the
size the jitted reward can afford (held-out Spearman about 0.85 against 0.80 on the seed
dataset), but it cannot run inside the environment. So it only labels random states of the
training programs at fit time, and the served network learns from its labels and from the
measurements.
"""

from __future__ import annotations

import os

import numpy as np

from mlirrl_jax.env.features import Features
from mlirrl_jax.surrogate.dataset import Dataset
from mlirrl_jax.util.progress import progress_bar


def tree_inputs(feats: Features, rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(N, columns) float32: every op's features and its loops' in one row; (N,): log of the
    program's iteration points (summed over ops), which the trees' target is relative to."""
    rows = rows or slice(None)
    op = np.asarray(feats.op_features[rows], np.float32)
    loop = np.asarray(feats.loop_features[rows], np.float32)
    log_points = np.asarray(feats.log_points[rows], np.float64)
    valid = np.asarray(feats.op_valid[rows])
    total = np.log(np.sum(np.where(valid, np.exp(log_points), 0.0), axis=1))
    return np.concatenate([op.reshape(len(op), -1), loop.reshape(len(loop), -1)], axis=1), total


class TreeTeacher:
    """Predicts log run time as log points + the trees' log time per point."""

    def __init__(self, booster):
        self.booster = booster

    def predict(self, feats: Features, chunk: int = 8192) -> np.ndarray:
        rows = len(feats.log_points)
        out = []
        for start in range(0, rows, chunk):
            inputs, total = tree_inputs(feats, slice(start, start + chunk))
            out.append(self.booster.predict(inputs, num_threads=os.cpu_count() or 1) + total)
        return np.concatenate(out).astype(np.float32)


def tree_params(leaves: int, seed: int, objective: str = "regression") -> dict:
    """LightGBM's settings for the teacher's trees (and other trees on the same inputs)."""
    return {
        "objective": objective,
        "learning_rate": 0.05,
        "num_leaves": leaves,
        "min_data_in_leaf": 10,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "feature_fraction": 0.5,
        "seed": seed,
        "deterministic": True,
        "num_threads": os.cpu_count() or 1,
        "verbose": -1,
    }


def fit_tree_teacher(
    data: Dataset, rounds: int, leaves: int, seed: int
) -> tuple[TreeTeacher, list[dict]]:
    """Boost `rounds` trees of up to `leaves` leaves on the measured rows (squared error of
    log time per iteration point); returns the teacher and its training curve."""
    import lightgbm

    inputs, total = tree_inputs(data.features)
    params = tree_params(leaves, seed)
    train = lightgbm.Dataset(inputs, data.log_time - total, free_raw_data=True)
    history: list[dict] = []
    bar = progress_bar(total=rounds, unit="tree", mininterval=1.0, desc="trees", leave=False)

    def record(env) -> None:
        bar.update(1)
        if env.iteration % 100 == 0 or env.iteration == rounds - 1:
            _, name, value, _ = env.evaluation_result_list[0]
            history.append({"round": env.iteration, name: float(value)})

    booster = lightgbm.train(
        params, train, num_boost_round=rounds, valid_sets=[train], callbacks=[record]
    )
    bar.close()
    return TreeTeacher(booster), history
