"""The user's command: the trained agent on a kernel of their own, on their machine.

`optimize(path, out)` loads any MLIR that `load_program` accepts, asks the agent for its best
distinct schedules by the surrogate, measures the top k for real beside the unscheduled program
and the heuristic schedule (all verified against the reference), and writes into `out` the best
schedule's JSON (`schedule.json`), its Transform-dialect script (`transform.mlir`), the
transformed kernel (`transformed.mlir`), every measurement (`measurements.jsonl`) and, last,
`summary.json`, each file whole or not at all. The methods are strategies of
`mlirrl_jax.strategies`, measured by its `measure_candidates`. When the unscheduled program's run exceeds the
time limit (a batch-256 layer can take tens of seconds a run), the schedules are still measured
and ranked by their own times, and the summary says that there is no speedup over it. The
kernel and the agent's run are checked before JAX starts (this module imports it only then), so
a wrong path costs no start-up.

The agent is `--run`'s, else the one adapted to this machine at the thread count
(`adapted/<machine id>.json` in the user data directory (`shipped.user_data_dir`) names the runs, written by `mlirrl-jax demo` and by
`train --adopt`), else the shipped one (`data/agent/`). With `search="evolutionary"` the
surrogate-guided evolutionary search (`mlirrl_jax.search`) is measured too, and the best of
everything wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlirrl_jax.adopted import default_agent_run
from mlirrl_jax.errors import Error
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import (
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_MEM_LIMIT_MB,
    DEFAULT_REFERENCE_TIMEOUT_S,
    Runner,
    timeout_phase,
)
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.records import OptimizeSummary, Ranked
from mlirrl_jax.runfolder import check_inputs, write_atomic
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.strategies import (
    Measured,
    Method,
    Proposing,
    Searching,
    measure_candidates,
    registry,
)
from mlirrl_jax.transform import transform_script

SEARCHES = ("none", "evolutionary")


class OptimizeError(Error, ValueError):
    """Input `optimize` cannot take (no agent, a program beyond the environment's limits)."""


def search_surrogate(agent):
    """The cost model a search starts from: the agent's (the analytic stand-in has nothing to
    fine-tune: refused)."""
    from mlirrl_jax.surrogate.api import CostModel

    if not agent.surrogate.path or agent.surrogate.path == "analytic":
        raise OptimizeError(
            "the evolutionary search needs the agent's surrogate to be a cost model"
        )
    return CostModel.load(agent.surrogate.path)


def check_program(program: Program) -> None:
    """Refuse a program the environment's tables cannot hold, naming the limit."""
    from mlirrl_jax.env.state import EncodingError
    from mlirrl_jax.env.table import encode_programs

    try:
        encode_programs([program])
    except EncodingError as exc:  # too many ops, loops or operands
        raise OptimizeError(f"{program.name}: beyond the agent's limits: {exc}") from None


def optimize(
    path: str | os.PathLike,
    out: str | os.PathLike,
    budget: int = 8,
    threads: int = 1,
    run: str | os.PathLike | None = None,
    timeout_s: float = 60.0,
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB,
    seed: int = 0,
    say=print,
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
    reference_timeout_s: float = DEFAULT_REFERENCE_TIMEOUT_S,
    search: str = "none",
    search_budget: int = 64,
    start: str = "known",
) -> OptimizeSummary:
    """Optimize the kernel in `path` into the folder `out`; returns the summary. `timeout_s`
    bounds each kernel's run, the other two limits its compiling and its reference outputs.
    `search="evolutionary"` also runs the surrogate-guided evolutionary search
    (`mlirrl_jax.search`) with `search_budget` real measurements, after the agent's.
    `start="known"`: the agent's proposals hold the heuristic's schedule and refinements of it
    beside its own (`Agent.proposals`); "scratch": its own only."""
    if search not in SEARCHES:
        raise OptimizeError(f"search {search!r}: expected one of {', '.join(SEARCHES)}")
    if search != "none" and search_budget < 1:
        raise OptimizeError(f"--search-budget must be at least 1, got {search_budget}")
    if budget < 1:
        raise OptimizeError(f"--budget must be at least 1, got {budget}")
    if threads < 1:
        raise OptimizeError(f"--threads must be at least 1, got {threads}")
    program = load_program(str(path))
    run = Path(run) if run else default_agent_run(threads)
    check_inputs(runs=(run,))
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.agent.surrogate import check_this_machine
    from mlirrl_jax.host_devices import use_compilation_cache
    from mlirrl_jax.measure.compile import transformed_mlir

    use_compilation_cache()  # a rerun loads the agent's compiled search instead of compiling it
    check_program(program)
    agent = Agent.load(run)
    check_this_machine(agent.surrogate, [threads])
    say(
        f"{program.name}: {len(program.ops)} op(s), {program.flops / 1e6:.1f} MFLOP; agent {run} "
        f"(surrogate of machine {agent.surrogate.machine_id or '-'}; this machine is "
        f"{machine_fingerprint()['machine_id']})"
    )
    # the heuristic's schedule is measured anyway: with a known start it joins the proposals
    # beside `budget` others, so that the agent's budget goes to new schedules
    wanted = budget + 1 if start == "known" else budget
    ctx = Proposing([program], threads, wanted, seed, agent, start)
    strategies = registry()
    heuristic = strategies[Method.HEURISTIC].propose(ctx)[0]
    proposals = {
        Method.HEURISTIC: heuristic,
        Method.AGENT_TOPK: [
            c
            for c in strategies[Method.AGENT_TOPK].propose(ctx)[0]
            if c.schedule.hash != heuristic[0].schedule.hash
        ][:budget],
    }
    searches = [Method.EVOLUTIONARY] if search == "evolutionary" else []
    surrogate = search_surrogate(agent) if searches else None
    method = TimingMethod(seed=seed)
    with Runner(
        timeout_s,
        mem_limit_mb,
        compile_timeout_s=compile_timeout_s,
        reference_timeout_s=reference_timeout_s,
    ) as runner:
        base = runner.measure(program, None, threads=1, method=method)
        say(f"  unscheduled: {base.summary()}")
        baseline_note = None
        if timeout_phase(base) == "run":  # the schedules can still be ranked by their own times
            baseline_note = (
                f"the unscheduled program's run exceeded the {timeout_s:g} s limit: no speedup "
                "over it; the schedules are ranked by their own times"
            )
            say(f"  {baseline_note}")
        elif not base.ok:
            raise OptimizeError(f"{program.name}: the unscheduled program failed: {base.summary()}")
        once = Measured.on(runner, program, threads, method)
        # the search starts from every schedule measured before it: the best of everything
        searching = Searching(program, threads, search_budget, seed, base, surrogate, say)
        trials = measure_candidates(once, proposals, searches, searching, say=say)
    tuned = trials[Method.HEURISTIC][0].measurement
    measured = [
        (t.source, t.measurement, t.candidate.predicted) for found in trials.values() for t in found
    ]
    good = [(name, m) for name, m, _ in measured if m.ok and m.verified and m.median_s]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(
        out / "measurements.jsonl",
        "".join(
            json.dumps({"source": name, "predicted_speedup": predicted, **m.to_json()}) + "\n"
            for name, m, predicted in [("unscheduled", base, None), *measured]
        ),
    )
    heuristic_ms = tuned.median_s * 1e3 if tuned.ok and tuned.verified else None
    baseline_ms = base.median_s * 1e3 if base.ok else None
    if not good:
        summary = OptimizeSummary(
            program=program.name,
            verified=False,
            measurements=len(measured) + 1,
            baseline_ms=baseline_ms,
            baseline_note=baseline_note,
            heuristic_ms=heuristic_ms,
        )
        write_atomic(out / "summary.json", json.dumps(summary.to_json(), indent=1))
        raise OptimizeError(
            f"{program.name}: no schedule verified; see {out / 'measurements.jsonl'}"
        )
    good.sort(key=lambda item: item[1].median_s)
    source, best = good[0]
    ranking = [
        Ranked(
            source=name,
            ms=m.median_s * 1e3,
            over_best=m.median_s / best.median_s,  # 1 for the best, above 1 for the others
            speedup=base.median_s / m.median_s if base.ok else None,
        )
        for name, m in good
    ]
    say(
        "  ranked by time: "
        + ", ".join(
            f"{r.source} {r.ms:.3f} ms"
            + (f" ({r.over_best:.2f}x the best's time)" if r.over_best > 1 else "")
            for r in ranking[:10]
        )
        + (f", and {len(ranking) - 10} more" if len(ranking) > 10 else "")
    )
    schedule = Schedule.from_json(best.schedule)
    script = transform_script(program, schedule) if not schedule.is_empty else ""
    write_atomic(out / "schedule.json", json.dumps(schedule.to_json(), indent=1))
    write_atomic(out / "transform.mlir", script + "\n")
    write_atomic(out / "transformed.mlir", transformed_mlir(program.mlir, script or None))
    summary = OptimizeSummary(
        program=program.name,
        machine_id=machine_fingerprint()["machine_id"],
        agent=str(run),
        threads=threads,
        baseline_ms=baseline_ms,
        baseline_note=baseline_note,
        heuristic_ms=heuristic_ms,
        best_ms=best.median_s * 1e3,
        best_source=source,
        speedup=ranking[0].speedup,
        over_heuristic=(heuristic_ms / (best.median_s * 1e3)) if heuristic_ms else None,
        gflops=best.gflops,
        verified=True,
        max_error=best.max_error,
        measurements=len(measured) + 1,
        schedule=schedule.describe(),
        ranking=ranking,
        replay=f"mlirrl-jax measure {path} --schedule {out / 'schedule.json'} --threads {threads}",
    )
    write_atomic(out / "summary.json", json.dumps(summary.to_json(), indent=1))  # last: whole
    return summary
