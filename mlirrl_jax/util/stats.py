"""Statistics the reports share."""

from __future__ import annotations

import math
import statistics


def geomean(values) -> float:
    """Geometric mean of the positive values (nan if there are none)."""
    values = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def pick_evenly(items: list, count: int) -> list:
    """`count` items evenly spaced over the list (all of them if it is not longer)."""
    if count >= len(items):
        return list(items)
    return [items[int(i * len(items) / count)] for i in range(count)]
