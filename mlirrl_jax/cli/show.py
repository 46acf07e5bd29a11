"""`mlirrl-jax show PROGRAM`: a program's loops, and a schedule's Transform-dialect script
(given, the heuristic's, or the agent's best by its surrogate)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlirrl_jax.cli.options import POSITIVE_INT
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.transform import transform_script


def register(sub) -> None:
    p = sub.add_parser("show", help="describe a program; print a schedule's transform script")
    p.add_argument("program")
    p.add_argument("--schedule", help="schedule JSON file")
    p.add_argument("--heuristic", action="store_true", help="show the heuristic schedule")
    p.add_argument("--mlir", action="store_true", help="print the normalized kernel")
    p.add_argument("--agent", help="a training run folder: show its agent's schedule")
    p.add_argument(
        "-n", type=POSITIVE_INT, default=1, help="with --agent: the n best distinct schedules"
    )
    p.add_argument("--save", help="write the shown schedule's JSON to this file")
    p.add_argument(
        "--threads",
        type=POSITIVE_INT,
        default=1,
        help="threads the kernel runs on: the agent's and the heuristic's schedule for them",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    program = load_program(args.program)
    print(program.describe())
    schedule = None
    if args.agent:
        from mlirrl_jax.agent.agent import Agent
        from mlirrl_jax.agent.surrogate import check_this_machine

        agent = Agent.load(args.agent)
        check_this_machine(agent.surrogate, [args.threads])
        best = agent.scored_schedules([program], n=args.n, threads=args.threads)[0]
        for rank, scored in enumerate(best, 1):
            print(
                f"\nagent schedule {rank}/{len(best)} ({args.agent}): predicted "
                f"{scored.predicted_speedup:.2f}x by the surrogate of machine "
                f"{agent.surrogate.machine_id or '-'}: {scored.schedule.describe()}"
            )
        schedule = best[0].schedule
    elif args.schedule or args.heuristic:
        schedule = (
            Schedule.load(args.schedule)
            if args.schedule
            else heuristic_schedule(program, args.threads)
        )
        print(f"\nschedule: {schedule.describe()}")
    if schedule is not None:
        print()
        print(transform_script(program, schedule))
        if args.save:
            Path(args.save).write_text(json.dumps(schedule.to_json(), indent=1))
            print(f"schedule written to {args.save}", file=sys.stderr)
    if args.mlir:
        print(program.mlir)
    return 0
