"""One program's plan measured at one thread count: each distinct schedule once, each method
credited with what it would have spent, the evolutionary search last (`measure_plan`)."""

from __future__ import annotations

import logging

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.select import program_kind
from mlirrl_jax.records import MethodResult, ValidationRow
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.validation.config import MATMUL_KINDS, ValidationConfig
from mlirrl_jax.validation.plan import Plan
from mlirrl_jax.validation.report import (
    TRIAL_METHODS,
)

log = logging.getLogger(__name__)


def best_measurement(measurements: list[Measurement]) -> Measurement | None:
    ok = [m for m in measurements if m.ok and m.verified and m.median_s]
    return min(ok, key=lambda m: m.median_s) if ok else None


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
    reuses what the other methods measured."""
    k = config.budget
    method = TimingMethod(seed=config.seed)
    heuristic = heuristic_schedule(p.program, threads)
    schedules = {
        "heuristic": [heuristic],
        "agent_greedy": [p.greedy[0]],
        "agent_topk": [s for s, _ in p.agent_topk],
        "random_k": [s for s, _ in p.random[:k]],
        "random_8k": [s for s, _ in p.random],
        "surrogate_topk": [s for s, _ in p.guided],
    }
    if config.agent_start != "scratch":
        schedules["agent_scratch_topk"] = [s for s, _ in p.agent_scratch]
    spent = {
        "heuristic": 0,
        "agent_greedy": 0,
        "agent_topk": len(schedules["agent_topk"]),
        "random_k": len(schedules["random_k"]),
        "random_8k": len(schedules["random_8k"]),
        "surrogate_topk": len(schedules["surrogate_topk"]),
        "agent_scratch_topk": len(p.agent_scratch),
    }
    measured: dict[str, Measurement] = {}

    def measure(s: Schedule) -> Measurement:
        if s.hash not in measured:
            measured[s.hash] = runner.measure(
                p.program, s, threads=threads, method=method, timeout_s=config.timeout_s
            )
        return measured[s.hash]

    for name in schedules:
        for s in schedules[name]:
            measure(s)
    evolved = None
    if config.evolutionary_budget and surrogate is not None:
        from mlirrl_jax.search import EvolutionarySearch, EvolutionConfig

        search = EvolutionarySearch(
            p.program,
            surrogate,
            threads,
            EvolutionConfig(budget=config.evolutionary_budget, seed=config.seed),
        )
        # the heuristic's schedule is its own method's: the search's first parent, not a trial
        # of its own (a known schedule is neither measured again nor credited to the search)
        evolved = search.run(
            measure,
            baseline=base if base.ok and base.verified else None,
            known=[(heuristic, measure(heuristic))],
        )
        schedules["evolutionary"] = [t.schedule for t in evolved.trials]
        spent["evolutionary"] = len(evolved.trials)
    if store is not None:
        store.put(list(measured.values()))
    row = ValidationRow(
        program=p.program.name,
        program_hash=p.program.hash,
        kind=program_kind(p.program),
        threads=threads,
        flops=p.program.flops,
        kernel_measurements=len(measured) + (1 if threads == config.threads[0] else 0),
        failed=sorted({m.status for m in measured.values() if not m.ok}),
        # candidate schedules that timed out, crashed or computed a wrong output: recorded
        # results, by reason, shown in the report's table
        failed_counts=failure_counts(m.status for m in measured.values() if not m.ok),
        unverified=sum(1 for m in measured.values() if m.ok and not m.verified),
        methods={"unscheduled": method_entry(base, 0, None)},
    )
    for name in schedules:
        best = best_measurement([measured[s.hash] for s in schedules[name]])
        predicted = (
            p.heuristic_predicted
            if name == "heuristic"
            else (p.predicted.get(best.schedule_hash) if best else None)
        )
        if name == "evolutionary" and evolved is not None and best is not None:
            # what the search's surrogate predicted when it chose the schedule
            predicted = next(
                t.predicted_speedup for t in evolved.trials if t.schedule.hash == best.schedule_hash
            )
        row.methods[name] = method_entry(best, spent[name], predicted)
        if name in TRIAL_METHODS:  # in the order measured: the sample-efficiency curve
            row.methods[name].trials_ms = [verified_ms(measured[s.hash]) for s in schedules[name]]
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
