"""The agent checked on real hardware: its schedules compiled, verified and timed on this
machine beside the unscheduled program and the heuristic schedule.

`measure_against_baselines(agent, programs, runner)` does the measuring (the agent's schedules
are chosen first, then every measurement runs in the runner's one worker, a program's three
back to back, so that no JAX work shares the cores with a timed kernel); `summarize` gives the
geomean speedups over unscheduled (all programs and per op kind) and the surrogate's
predicted-vs-real error; `format_report` renders both as Markdown.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod, speedup
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.programs.suites import UnknownProgramError, get
from mlirrl_jax.schedule import Schedule


def geomean(values) -> float:
    """Geometric mean of the positive values (nan if there are none)."""
    values = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def pick_evenly(items: list, count: int) -> list:
    """`count` items evenly spaced over the list (all of them if it is not longer)."""
    if count >= len(items):
        return list(items)
    return [items[int(i * len(items) / count)] for i in range(count)]


def program_kind(program: Program) -> str:
    """The op kind of a suite program, else of its op with the most flops."""
    try:
        return get(program.name).kind
    except UnknownProgramError:
        return max(program.ops, key=lambda op: op.flops).kind


def measure_against_baselines(
    agent: Agent,
    programs: list[Program],
    runner: Runner,
    method: TimingMethod | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Per program: the unscheduled time and the real and predicted speedups of the agent's
    greedy schedule and of the heuristic schedule, all verified against the reference."""
    method = method or TimingMethod()
    evaluator = agent.evaluator(programs)
    greedy = [s[0] for s in agent.scored_schedules(programs, n=1, evaluator=evaluator)]
    heuristics = [heuristic_schedule(p) for p in programs]
    heuristic_predicted = np.exp(evaluator.heuristic(evaluator.prepare(agent.surrogate.params)))
    rows, started = [], time.perf_counter()
    for i, program in enumerate(programs):
        base = runner.measure(program, Schedule(), method=method)
        heuristic = runner.measure(program, heuristics[i], method=method)
        tuned = runner.measure(program, greedy[i].schedule, method=method)
        rows.append(
            {
                "program": program.name,
                "kind": program_kind(program),
                "baseline_ms": base.median_s * 1e3 if base.ok else None,
                "heuristic_speedup": speedup(base, heuristic),
                "agent_speedup": speedup(base, tuned),
                "heuristic_predicted": float(heuristic_predicted[i]),
                "agent_predicted": greedy[i].predicted_speedup,
                "status": "/".join(m.status for m in (base, heuristic, tuned)),
                "verified": all(m.verified for m in (base, heuristic, tuned)),
                "agent_schedule": greedy[i].schedule.to_json(),
                "heuristic_schedule": heuristics[i].to_json(),
            }
        )
        if progress:
            r, elapsed = rows[-1], time.perf_counter() - started
            eta = elapsed / (i + 1) * (len(programs) - i - 1)
            progress(
                f"  [{i + 1}/{len(programs)}] {program.name}: heuristic "
                f"{r['heuristic_speedup'] or 0:.2f}x, agent {r['agent_speedup'] or 0:.2f}x "
                f"(predicted {r['agent_predicted']:.2f}x), {r['status']} "
                f"({elapsed:.0f} s, ~{eta:.0f} s left)"
            )
    return rows


def _errors(rows: list[dict], name: str) -> dict:
    real = np.array([r[f"{name}_speedup"] for r in rows])
    predicted = np.array([r[f"{name}_predicted"] for r in rows])
    log_error = np.log(predicted) - np.log(real)
    return {
        "mape": float(np.mean(np.abs(predicted - real) / real)),
        "median_abs_log_error": float(np.median(np.abs(log_error))),
        "mean_log_error": float(np.mean(log_error)),
    }


def summarize(rows: list[dict]) -> dict:
    """Geomean speedups over the programs whose three measurements verified, per op kind too,
    and the surrogate's error on those schedules."""
    ok = [r for r in rows if r["verified"] and r["agent_speedup"] and r["heuristic_speedup"]]
    by_kind = defaultdict(list)
    for r in ok:
        by_kind[r["kind"]].append(r)
    return {
        "programs": len(rows),
        "verified_programs": len(ok),
        "geomean_agent": geomean(r["agent_speedup"] for r in ok),
        "geomean_heuristic": geomean(r["heuristic_speedup"] for r in ok),
        "agent_at_least_heuristic": sum(r["agent_speedup"] >= r["heuristic_speedup"] for r in ok),
        "by_kind": {
            kind: {
                "programs": len(group),
                "agent": geomean(r["agent_speedup"] for r in group),
                "heuristic": geomean(r["heuristic_speedup"] for r in group),
            }
            for kind, group in sorted(by_kind.items())
        },
        "surrogate_error_agent": _errors(ok, "agent") if ok else {},
        "surrogate_error_heuristic": _errors(ok, "heuristic") if ok else {},
    }


def _x(value) -> str:
    return f"{value:.2f}x" if value else "-"


def format_report(rows: list[dict], summary: dict) -> str:
    """Markdown: one row per program, then the geomeans (all, per kind) and the errors."""
    lines = [
        "| program | kind | unscheduled ms | heuristic | agent | agent predicted | verified |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = f"{r['baseline_ms']:.3f}" if r["baseline_ms"] else "-"
        lines.append(
            f"| {r['program'].split('/')[-1]} | {r['kind']} | {base} | "
            f"{_x(r['heuristic_speedup'])} | {_x(r['agent_speedup'])} | "
            f"{_x(r['agent_predicted'])} | {r['verified']} |"
        )
    n = summary["verified_programs"]
    if not n:
        return "\n".join([*lines, "", "no program verified all three measurements"])
    ratio = summary["geomean_agent"] / summary["geomean_heuristic"]
    lines += [
        "",
        f"geomean real speedup over unscheduled, {n} verified programs: agent "
        f"{summary['geomean_agent']:.2f}x, heuristic {summary['geomean_heuristic']:.2f}x "
        f"(agent / heuristic {ratio:.2f}; the agent at least the heuristic on "
        f"{summary['agent_at_least_heuristic']} of {n})",
        "",
        "| op kind | programs | agent | heuristic |",
        "|---|---|---|---|",
        *(
            f"| {kind} | {g['programs']} | {g['agent']:.2f}x | {g['heuristic']:.2f}x |"
            for kind, g in summary["by_kind"].items()
        ),
        "",
        "surrogate's predicted vs real speedup: "
        + "; ".join(
            f"{name} schedules MAPE {e['mape']:.1%}, median |log error| "
            f"{e['median_abs_log_error']:.3f}, mean log error {e['mean_log_error']:+.3f}"
            for name, e in (
                ("agent", summary["surrogate_error_agent"]),
                ("heuristic", summary["surrogate_error_heuristic"]),
            )
        ),
    ]
    return "\n".join(lines)


def save_plot(rows: list[dict], path) -> None:
    """Real speedups of the heuristic and the agent per program; predicted vs real."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["verified"] and r["agent_speedup"] and r["heuristic_speedup"]]
    if not ok:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    order = np.argsort([r["heuristic_speedup"] for r in ok])
    x = np.arange(len(ok))
    axes[0].plot(x, [ok[i]["heuristic_speedup"] for i in order], "s", label="heuristic")
    axes[0].plot(x, [ok[i]["agent_speedup"] for i in order], "o", label="agent (greedy)")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("program (sorted by the heuristic's speedup)")
    axes[0].set_ylabel("real speedup over unscheduled")
    axes[0].legend()
    for name, marker in (("agent", "o"), ("heuristic", "s")):
        axes[1].scatter(
            [r[f"{name}_speedup"] for r in ok],
            [r[f"{name}_predicted"] for r in ok],
            s=14,
            marker=marker,
            label=name,
        )
    values = [
        r[f"{n}_{k}"] for r in ok for n in ("agent", "heuristic") for k in ("speedup", "predicted")
    ]
    lo, hi = min(values), max(values)
    axes[1].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("real speedup")
    axes[1].set_ylabel("surrogate's predicted speedup")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
