"""One program's plan measured at one thread count: each distinct schedule once, each method
credited with what it would have spent, the evolutionary search last (`measure_plan`)."""

from __future__ import annotations

import logging

from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.select import program_kind
from mlirrl_jax.records import MethodResult, ValidationRow
from mlirrl_jax.strategies import (
    Measured,
    Method,
    Searching,
    best_trial,
    measure_candidates,
    registry,
)
from mlirrl_jax.validation.config import MATMUL_KINDS, ValidationConfig
from mlirrl_jax.validation.plan import Plan, validation_methods

log = logging.getLogger(__name__)


def measure_plan(
    p: Plan,
    threads: int,
    base: Measurement,
    runner: Runner,
    config: ValidationConfig,
    store,
    surrogate=None,
) -> ValidationRow:
    """Every method's measurements of one program at one thread count: each distinct
    schedule measured once, each method credited with what it would have spent. The
    evolutionary search (`surrogate`: the cost model it starts from) runs last, so that it
    reuses what the other methods measured; it starts from the heuristic's schedule alone."""
    method = TimingMethod(seed=config.seed)
    measured = Measured.on(runner, p.program, threads, method, timeout_s=config.timeout_s)
    strategies = registry()
    searches = [
        m
        for m in validation_methods(config)
        if strategies[m].searches and (m != Method.EVOLUTIONARY or surrogate is not None)
    ]
    ctx = Searching(p.program, threads, config.evolutionary_budget, config.seed, base, surrogate)
    # the heuristic's schedule is its own method's: the search's first parent, not a trial
    # of its own (a known schedule is neither measured again nor credited to the search)
    trials = measure_candidates(
        measured, p.proposals, searches, ctx, known_from=(Method.HEURISTIC,)
    )
    if store is not None:
        store.put(list(measured.by_hash.values()))
    failures = [m for m in measured.by_hash.values() if not m.ok]
    row = ValidationRow(
        program=p.program.name,
        program_hash=p.program.hash,
        kind=program_kind(p.program),
        threads=threads,
        flops=p.program.flops,
        kernel_measurements=len(measured.by_hash) + (1 if threads == config.threads[0] else 0),
        failed=sorted({m.status for m in failures}),
        # candidate schedules that timed out, crashed or computed a wrong output: recorded
        # results, by reason, shown in the report's table
        failed_counts=failure_counts(m.status for m in failures),
        unverified=sum(1 for m in measured.by_hash.values() if m.ok and not m.verified),
        methods={"unscheduled": method_entry(base, 0, None)},
    )
    for name, found in trials.items():
        strategy = strategies[name]
        best = best_trial(found)
        row.methods[name.value] = method_entry(
            best.measurement if best else None,
            len(found) if strategy.spends else 0,
            best.candidate.predicted if best else None,
        )
        if strategy.curve:  # in the order measured: the sample-efficiency curve
            row.methods[name.value].trials_ms = [verified_ms(t.measurement) for t in found]
    if config.xla:
        from mlirrl_jax.measure.baselines import measure_xla

        row.methods["xla"] = external_entry(
            measure_xla(p.program, threads, method, timeout_s=config.timeout_s)
        )
    if config.numpy and row.kind in MATMUL_KINDS:
        from mlirrl_jax.measure.baselines import measure_numpy

        row.methods["numpy"] = external_entry(
            measure_numpy(p.program, threads, method, timeout_s=config.timeout_s)
        )
    return row


def verified_ms(m: Measurement) -> float | None:
    return m.median_s * 1e3 if m.ok and m.verified and m.median_s else None


def method_entry(m: Measurement | None, spent: int, predicted: float | None) -> MethodResult:
    if m is None:
        return MethodResult(ms=None, spent=spent, status="no verified schedule")
    return MethodResult(
        ms=verified_ms(m),
        spent=spent,
        status=m.status if m.verified or not m.ok else "unverified",
        predicted=predicted,
        schedule=m.schedule,
    )


def external_entry(m) -> MethodResult:
    """A library baseline's result (XLA, NumPy): no schedule, no measurement spent."""
    if m is None:
        return MethodResult(ms=None, spent=0, status="not available for this program")
    good = m.status == "ok" and m.verified and m.median_s
    return MethodResult(
        ms=m.median_s * 1e3 if good else None,
        spent=0,
        status=m.status if m.verified or m.status != "ok" else "unverified",
    )


def failure_counts(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))
