"""The validation's report as Markdown (`format_validation`) and its best schedules and programs
saved for replay (`save_schedules`, `save_programs`)."""

from __future__ import annotations

import json
import logging
import math
import shlex
from pathlib import Path

from mlirrl_jax.programs.ir import Program
from mlirrl_jax.records import ValidationRow
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.validation.config import ValidationConfig
from mlirrl_jax.validation.report import (
    LABELS,
    METHODS,
    SCHEDULED,
    format_sample_efficiency,
    speedups,
)

log = logging.getLogger(__name__)


def _slug(name: str) -> str:
    return name.split("://")[-1].replace("/", "_")


def save_schedules(rows: list[ValidationRow], folder: Path) -> dict:
    """Each row's measured methods' best schedules as JSON files; returns
    {(program, threads, method): path}."""
    paths = {}
    for r in rows:
        for name, m in r.methods.items():
            if name == "unscheduled" or m.schedule is None or m.ms is None:
                continue
            path = folder / _slug(r.program) / f"{name}-t{r.threads}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(m.schedule, indent=1))
            paths[(r.program, r.threads, name)] = path
    return paths


def save_programs(programs: list[Program], folder: Path) -> dict[str, str]:
    """What a replay command loads each program from: its suite URI, else its MLIR saved under
    `folder` (the user's file may change or move after the run); {program name: source}."""
    sources = {}
    for p in programs:
        if p.name.startswith("suite://"):  # a suite never changes under its version
            sources[p.name] = p.name
            continue
        path = folder / f"{_slug(p.name)}.mlir"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, p.mlir)
        sources[p.name] = str(path)
    return sources


def _f(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def agents_line(summary: dict) -> str:
    """Which agent (run, its surrogate's machine and threads) each thread count used."""
    agent, machine = summary.get("agent"), summary.get("surrogate_machine")
    threads = summary.get("surrogate_threads") or {}
    if not isinstance(agent, dict) and not isinstance(machine, dict):
        adapted = sorted(set(threads.values())) or [1]
        return (
            f"`{agent}` (surrogate of machine {machine}, fitted at "
            f"{'/'.join(map(str, adapted))} thread(s)) at every thread count"
        )
    parts = []
    for t in threads or {}:
        run = agent.get(t) if isinstance(agent, dict) else agent
        m = machine.get(t) if isinstance(machine, dict) else machine
        parts.append(f"{t} thread(s): `{run}` (surrogate of machine {m} at {threads[t]})")
    return "; ".join(parts)


def format_validation(
    rows: list[ValidationRow], summary: dict, config: ValidationConfig, paths, sources: dict
) -> str:
    """Markdown: per thread count, each program's speedups per method, then the geomeans,
    the agent against the baselines, per op kind against XLA, and replay commands (`paths`:
    `save_schedules`'s, `sources`: `save_programs`')."""
    k = config.budget
    lines = [
        f"# Validation on machine {summary.get('machine_id')}",
        "",
        f"Agent: {agents_line(summary)}. "
        f"k = {k}: the agent's top-k, random search with k and {k * config.random_factor} real "
        f"measurements, the surrogate's top-k of {config.guided_samples} random schedules"
        + (
            f", the surrogate-guided evolutionary search with {config.evolutionary_budget}"
            if config.evolutionary_budget
            else ""
        )
        + ". Speedups "
        "are over the unscheduled program measured in the same run (one thread); every kernel "
        "output verified against the reference; '-' where a method had no verified result. A "
        "candidate that timed out, crashed or computed a wrong output is a recorded result, "
        "counted in the last column.",
    ]
    if summary.get("peak_gflops_one_core"):
        lines.append(
            f"Measured FMA peak: {summary['peak_gflops_one_core']:.1f} GFLOP/s per core "
            "(`mlirrl_jax/measure/peak.py`)."
        )
    for threads, entry in summary["threads"].items():
        group = [r for r in rows if str(r.threads) == threads]
        names = [n for n in METHODS if n != "unscheduled" and any(n in r.methods for r in group)]
        lines += [
            "",
            f"## {threads} thread(s): {entry['programs']} programs",
            "",
            "| program | kind | unscheduled ms | "
            + " | ".join(LABELS[n] for n in names)
            + " | candidates failed |",
            "|---|---|---|" + "---|" * len(names) + "---|",
        ]
        for r in group:
            s = speedups(r)
            failed = r.failed_counts or {f: "" for f in r.failed}
            lines.append(
                f"| {r.program.split('/')[-1]} | {r.kind} | "
                f"{_f(r.methods['unscheduled'].ms, '.3f')} | "
                + " | ".join(_f(s.get(n), ".2f") + ("x" if s.get(n) else "") for n in names)
                + f" | {', '.join(f'{k} {v}'.strip() for k, v in failed.items()) or '-'} |"
            )
        m = entry["methods"]
        lines += [
            "",
            "| method | geomean speedup | programs | real measurements per program |",
            "|---|---|---|---|",
            *(
                f"| {LABELS[n]} | {_f(m[n]['geomean_speedup'], '.2f')}x | {m[n]['programs']} | "
                f"{_f(m[n]['measurements_per_program'], '.0f')} |"
                for n in METHODS
                if m[n]["programs"]
            ),
            "",
            f"Agent top-{k} / random search with {k * config.random_factor}: "
            f"{_f(entry['agent_topk_over_random_8k'], '.3f')}; agent greedy (0 measurements) / "
            f"random {k * config.random_factor}: {_f(entry['agent_greedy_over_random_8k'], '.3f')}; "
            f"agent top-{k} / heuristic: {_f(entry['agent_topk_over_heuristic'], '.3f')}; "
            f"agent greedy / heuristic: {_f(entry.get('agent_greedy_over_heuristic'), '.3f')}"
            + (
                f"; agent top-{k} / evolutionary search with {config.evolutionary_budget}: "
                f"{_f(entry.get('agent_topk_over_evolutionary'), '.3f')}"
                if config.evolutionary_budget
                else ""
            )
            + f"; agent top-{k} / the best of the heuristic and the searches: "
            f"{_f(entry.get('agent_topk_over_best_search'), '.3f')}"
            + (
                f"; agent top-{k} / its top-{k} from scratch (without the heuristic's schedule "
                f"and its refinements): {_f(entry.get('agent_topk_over_agent_scratch_topk'), '.3f')}"
                f"; from scratch / heuristic: "
                f"{_f(entry.get('agent_scratch_topk_over_heuristic'), '.3f')}"
                if entry.get("agent_topk_over_agent_scratch_topk")
                else ""
            )
            + " (geomeans over the programs where both verified).",
            "",
            f"Surrogate's predicted speedup (its rows' threads: "
            f"{summary.get('surrogate_threads', {}).get(threads, 1)}) against real, best schedules: "
            + "; ".join(
                f"{LABELS[n]} predicted {m[n]['predicted_geomean']:.2f}x, real "
                f"{m[n]['real_geomean_predicted_programs']:.2f}x, MAPE {m[n]['prediction_mape']:.0%}"
                for n in SCHEDULED
                if m[n].get("predicted_geomean")
            )
            + ".",
            "",
            "| op kind | programs | agent top-k / heuristic | from scratch / heuristic | agent greedy / heuristic | agent top-k / XLA | best any method / XLA | agent top-k / random 8k | best fraction of peak |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {kind} | {e['programs']} | {_f(e.get('agent_topk_over_heuristic'), '.2f')} | "
                f"{_f(e.get('agent_scratch_topk_over_heuristic'), '.2f')} | "
                f"{_f(e.get('agent_greedy_over_heuristic'), '.2f')} | "
                f"{_f(e['agent_topk_over_xla'], '.2f')} | "
                f"{_f(e['best_any_over_xla'], '.2f')} | {_f(e['agent_topk_over_random_8k'], '.2f')} | "
                f"{_f(e.get('best_fraction_of_peak'), '.0%')} |"
                for kind, e in entry["by_kind"].items()
            ),
        ]
    lines += format_sample_efficiency(summary.get("sample_efficiency") or {}, config.budget)
    if paths:
        lines += [
            "",
            "## Replay",
            "",
            "Every measured method's best schedule is saved; the agent's top-k, for example:",
            "",
        ]
        shown = sorted((key, path) for key, path in paths.items() if key[2] == "agent_topk")
        for (program, threads, _), path in shown[:12]:
            lines.append(
                f"    mlirrl-jax measure {shlex.quote(sources[program])} --schedule "
                f"{shlex.quote(str(path))} --threads {threads}"
            )
        lines.append("")
        lines.append(
            f"({len(paths)} schedules under `{Path(next(iter(paths.values()))).parents[1]}`.)"
        )
    return "\n".join(lines)
