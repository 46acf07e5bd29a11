"""How good a cost model is on held-out programs: speedup error and ranking quality.

All metrics group by program: a schedule is only compared with schedules of the same program.
Predicted speedup = exp(predicted log time of the baseline - predicted log time of the
schedule), as the environment's reward uses it; programs without a measured baseline are left
out of the speedup error.
"""

from __future__ import annotations

import numpy as np


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def evaluate(
    predicted: np.ndarray,
    measured: np.ndarray,
    program: np.ndarray,
    is_baseline: np.ndarray,
    min_gap: float = 0.05,
) -> dict:
    """Metrics of predicted vs measured log times.

    - mape_speedup: mean |predicted/measured speedup - 1| over non-baseline schedules.
    - spearman: mean over programs (>= 3 schedules) of the rank correlation.
    - pairwise_accuracy: share of same-program pairs ordered correctly, over pairs whose
      measured times differ by more than `min_gap` in log (closer pairs are within noise).
    - top1 / top5 (TenSet): mean over programs (>= 2 schedules: a lone schedule is trivially
      the best) of best measured time / measured time of the best among the model's top-k
      picks.
    - top1_hit: share of programs (>= 3 schedules) whose predicted fastest schedule is the
      measured fastest, or within `min_gap` in log of it (a tie within noise).
    """
    errors, spearmans, top1, top5, hits = [], [], [], [], []
    correct = total = 0
    for p in np.unique(program):
        rows = np.flatnonzero(program == p)
        pred, true = predicted[rows], measured[rows]
        base = rows[is_baseline[rows]]
        if len(base):
            b = np.flatnonzero(is_baseline[rows])[0]
            others = np.flatnonzero(~is_baseline[rows])
            true_speedup = np.exp(true[b] - true[others])
            predicted_speedup = np.exp(pred[b] - pred[others])
            errors.extend(np.abs(predicted_speedup / true_speedup - 1.0))
        if len(rows) >= 3:
            spearmans.append(_spearman(pred, true))
        diff_true = true[:, None] - true[None, :]
        diff_pred = pred[:, None] - pred[None, :]
        pairs = np.triu(np.abs(diff_true) > min_gap, k=1)
        correct += int(np.sum((np.sign(diff_true) == np.sign(diff_pred)) & pairs))
        total += int(pairs.sum())
        if len(rows) >= 2:
            order = np.argsort(pred)
            best = true.min()
            top1.append(np.exp(best - true[order[:1]].min()))
            top5.append(np.exp(best - true[order[:5]].min()))
            if len(rows) >= 3:
                hits.append(float(true[order[0]] - best <= min_gap))
    spearmans = [s for s in spearmans if np.isfinite(s)]
    return {
        "programs": int(len(np.unique(program))),
        "schedules": int(len(program)),
        "mape_speedup": float(np.mean(errors)) if errors else float("nan"),
        "spearman": float(np.mean(spearmans)) if spearmans else float("nan"),
        "pairwise_accuracy": correct / total if total else float("nan"),
        "pairs": total,
        "top1": float(np.mean(top1)) if top1 else float("nan"),
        "top5": float(np.mean(top5)) if top5 else float("nan"),
        "top1_hit": float(np.mean(hits)) if hits else float("nan"),
    }
