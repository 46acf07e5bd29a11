"""The trained agent checked for real: its greedy schedules of held-out test programs, compiled,
verified and timed on this machine beside the unscheduled program and the heuristic schedule.

    python bench/agent_real_check.py --agent runs/NAME [--programs 40] [--suite dl-v0]
        [--out DIR] [--timeout 60]

The test programs are the `--suite`'s test split (never trained on by the agent or the
surrogate), `--programs` of them evenly spread over the split. The agent's schedules are chosen
first (JAX work); then every measurement runs in one worker, one at a time, a program's three
(unscheduled, heuristic, agent) back to back (`mlirrl_jax.validate`). Prints a table per
program, the geomean speedups over unscheduled (all programs and per op kind), and the
surrogate's predicted-vs-real error on the agent's and the heuristic's schedules; writes
results.json, results.md and real_speedups.png to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.programs.ir import parse_program
from mlirrl_jax.splits import TEST, entries
from mlirrl_jax.validate import (
    format_report,
    measure_against_baselines,
    pick_evenly,
    save_plot,
    summarize,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agent", required=True, help="a training run folder")
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--suite", default="dl-v0")
    parser.add_argument("--out", help="output folder (default: <agent>/real-check)")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    out = Path(args.out or Path(args.agent) / "real-check")
    out.mkdir(parents=True, exist_ok=True)
    here = machine_fingerprint()["machine_id"]
    chosen = pick_evenly(entries(TEST, (args.suite,)), args.programs)
    programs = [parse_program(e.text, e.uri) for e in chosen]
    agent = Agent.load(args.agent)
    print(
        f"{len(programs)} {args.suite} test programs; agent {args.agent}; surrogate of machine "
        f"{agent.surrogate.machine_id or '-'}; measuring on machine {here}",
        flush=True,
    )
    started = time.perf_counter()
    with Runner(timeout_s=args.timeout) as runner:
        rows = measure_against_baselines(
            agent, programs, runner, progress=lambda line: print(line, flush=True)
        )
    summary = {
        "machine_id": here,
        "surrogate_machine_id": agent.surrogate.machine_id,
        "agent": str(Path(args.agent).resolve()),
        "seconds": time.perf_counter() - started,
        **summarize(rows),
    }
    text = "\n".join(
        [
            f"# Agent vs heuristic, measured on machine {here}",
            "",
            f"command: `python bench/agent_real_check.py --agent {args.agent} --programs "
            f"{args.programs} --suite {args.suite}`; the surrogate is of machine "
            f"{agent.surrogate.machine_id or '-'}",
            "",
            format_report(rows, summary),
        ]
    )
    print(text)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    save_plot(rows, out / "real_speedups.png")
    print(f"\nwrote {out}/results.md, results.json, real_speedups.png")


if __name__ == "__main__":
    main()
