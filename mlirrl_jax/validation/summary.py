"""The validation's figures: per thread count and op kind, each method's geomean speedup and the
agent's ratios to the others (`summarize`)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict

import numpy as np

from mlirrl_jax.records import ValidationRow
from mlirrl_jax.util.stats import geomean
from mlirrl_jax.validation.config import ValidationConfig
from mlirrl_jax.validation.report import (
    METHODS,
    SCHEDULED,
    SEARCHES,
    sample_efficiency,
    speedups,
)

log = logging.getLogger(__name__)


def per_threads(values: dict, threads) -> object:
    """One value if every thread count has the same, else {"threads": value}."""
    distinct = {json.dumps(values[t], default=str) for t in threads}
    return values[threads[0]] if len(distinct) == 1 else {str(t): values[t] for t in threads}


def summarize(
    rows: list[ValidationRow], config: ValidationConfig, peak_gflops: float | None
) -> dict:
    """Per thread count: each method's geomean speedup over unscheduled (on the programs
    where every compared method verified), measurement counts, the agent against random
    search and against XLA per op kind, and GFLOP/s against the measured peak."""
    out: dict = {"threads": {}, "peak_gflops_one_core": peak_gflops}
    for threads in config.threads:
        group = [r for r in rows if r.threads == threads]
        if not group:
            continue
        per = [speedups(r) for r in group]
        by_method = {}
        for name in METHODS:
            values = [s[name] for s in per if s.get(name)]
            spent = [r.methods[name].spent for r in group if name in r.methods]
            by_method[name] = {
                "geomean_speedup": geomean(values) if values else None,
                "programs": len(values),
                "measurements_per_program": float(np.mean(spent)) if spent else None,
                **_predicted_against_real(group, per, name),
            }
        common = [s for s in per if s.get("agent_topk") and s.get("random_8k")]
        greedy_common = [s for s in per if s.get("agent_greedy") and s.get("random_8k")]
        entry = {
            "programs": len(group),
            "methods": by_method,
            "agent_topk_over_random_8k": _ratio(common, "agent_topk", "random_8k"),
            "agent_greedy_over_random_8k": _ratio(greedy_common, "agent_greedy", "random_8k"),
            "agent_topk_over_heuristic": _ratio(per, "agent_topk", "heuristic"),
            "agent_topk_over_evolutionary": _ratio(per, "agent_topk", "evolutionary"),
            # per program, the best of the heuristic and the searches the run measured
            "agent_topk_over_best_search": _ratio(
                _with_best_search(per), "agent_topk", "best_search"
            ),
            "agent_greedy_over_heuristic": _ratio(per, "agent_greedy", "heuristic"),
            # the heuristic's schedule and its refinements in the pool, against without them
            "agent_topk_over_agent_scratch_topk": _ratio(per, "agent_topk", "agent_scratch_topk"),
            "agent_scratch_topk_over_heuristic": _ratio(per, "agent_scratch_topk", "heuristic"),
            "by_kind": {},
        }
        kinds = defaultdict(list)
        for r, s in zip(group, per, strict=True):
            kinds[r.kind].append((r, s))
        for kind, members in sorted(kinds.items()):
            ss = [s for _, s in members]
            best_any = [
                {**s, "best_any": max(s[n] for n in SCHEDULED if s.get(n))}
                for s in ss
                if any(s.get(n) for n in SCHEDULED)
            ]
            k_entry = {
                "programs": len(members),
                "agent_topk_over_heuristic": _ratio(ss, "agent_topk", "heuristic"),
                "agent_greedy_over_heuristic": _ratio(ss, "agent_greedy", "heuristic"),
                "agent_topk_over_xla": _ratio(ss, "agent_topk", "xla"),
                "best_any_over_xla": _ratio(best_any, "best_any", "xla"),
                "agent_topk_over_random_8k": _ratio(ss, "agent_topk", "random_8k"),
                "agent_scratch_topk_over_heuristic": _ratio(ss, "agent_scratch_topk", "heuristic"),
                **{
                    n: geomean([s[n] for s in ss if s.get(n)])
                    if any(s.get(n) for s in ss)
                    else None
                    for n in METHODS
                },
            }
            if peak_gflops:
                fractions = []
                for r, s in members:
                    best = max((s[n] for n in SCHEDULED if s.get(n)), default=None)
                    if best:
                        ms = r.methods["unscheduled"].ms / best
                        fractions.append(r.flops / (ms * 1e-3) * 1e-9 / (peak_gflops * threads))
                k_entry["best_fraction_of_peak"] = (
                    float(np.median(fractions)) if fractions else None
                )
                if fractions and max(fractions) > 1:  # a peak measured wrong, or under load
                    log.warning(
                        "a %s kernel ran at %.0f%% of the measured FMA peak (%.1f GFLOP/s a "
                        "core): the peak is too low; measure it again on a quiet machine",
                        kind,
                        100 * max(fractions),
                        peak_gflops,
                    )
            entry["by_kind"][kind] = k_entry
        out["threads"][str(threads)] = entry
    out["sample_efficiency"] = sample_efficiency(rows, config.threads)
    return out


def _with_best_search(per: list[dict]) -> list[dict]:
    """Each program's speedups plus `best_search`: the best of the heuristic and the
    searches (`SEARCHES`) measured on it."""
    return [
        {**s, "best_search": max((s[n] for n in SEARCHES if s.get(n)), default=None)} for s in per
    ]


def _predicted_against_real(group: list[ValidationRow], per: list[dict], name: str) -> dict:
    """The surrogate's predicted speedups of a method's best schedules (one thread) against
    their real ones: geomeans of both and the MAPE, on the programs that have both."""
    pairs = [
        (r.methods[name].predicted, s[name])
        for r, s in zip(group, per, strict=True)
        if name in r.methods and r.methods[name].predicted and s.get(name)
    ]
    if not pairs:
        return {}
    predicted, real = (np.array(v, np.float64) for v in zip(*pairs, strict=True))
    return {
        "predicted_geomean": geomean(predicted),
        "real_geomean_predicted_programs": geomean(real),
        "prediction_mape": float(np.mean(np.abs(predicted - real) / real)),
    }


def _ratio(per: list[dict], a: str, b: str) -> float | None:
    pairs = [(s[a], s[b]) for s in per if s.get(a) and s.get(b)]
    if not pairs:
        return None
    return geomean([x for x, _ in pairs]) / geomean([y for _, y in pairs])
