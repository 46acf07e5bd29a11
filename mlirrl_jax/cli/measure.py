"""`mlirrl-jax measure PROGRAM`: a program unscheduled and with a schedule (the heuristic's by
default), each output verified, timed on this machine."""

from __future__ import annotations

import json

from mlirrl_jax.cli.options import POSITIVE_INT, add_phase_limits, add_worker_options
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod, speedup
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.schedule import Schedule, ScheduleError
from mlirrl_jax.transform import transform_script


def register(sub) -> None:
    p = sub.add_parser("measure", help="measure a program unscheduled and with a schedule")
    p.add_argument("program", help="suite:// URI, .mlir file")
    p.add_argument("--schedule", help="schedule JSON file (default: the heuristic schedule)")
    p.add_argument("--json", action="store_true", help="print both measurements as JSON")
    p.add_argument(
        "--threads", type=POSITIVE_INT, default=1, help="threads of the scheduled kernel (1)"
    )
    p.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", "async", "openmp"],
        help="parallel runtime when --threads > 1 (auto: OpenMP if installed)",
    )
    add_worker_options(p)
    add_phase_limits(p)
    p.set_defaults(func=run)


def runner_of(args) -> Runner:
    """The measurement worker of a command's worker options and phase limits."""
    return Runner(
        timeout_s=args.timeout,
        mem_limit_mb=args.mem_limit,
        compile_timeout_s=args.compile_timeout,
        reference_timeout_s=args.reference_timeout,
    )


def schedule_to_measure(args, program: Program) -> tuple[Schedule, str]:
    """`measure`'s schedule (--schedule, else the heuristic's for --threads) and its label,
    checked against the program before anything is measured."""
    if args.schedule:
        schedule, label = Schedule.load(args.schedule), args.schedule
    else:
        schedule, label = heuristic_schedule(program, args.threads), "heuristic schedule"
    try:
        transform_script(program, schedule)  # op ids, loop counts, permutations: no compiling
    except ScheduleError as exc:
        raise ScheduleError(f"{label} does not fit {program.name}: {exc}") from None
    return schedule, label


def run(args) -> int:
    program = load_program(args.program)
    schedule, label = schedule_to_measure(args, program)
    method = TimingMethod(seed=args.seed)
    with runner_of(args) as runner:
        base = runner.measure(program, None, threads=1, method=method)
        tuned = runner.measure(
            program, schedule, threads=args.threads, runtime=args.runtime, method=method
        )
    if args.json:
        print(json.dumps({"baseline": base.to_json(), "scheduled": tuned.to_json()}, indent=1))
        return 0 if tuned.ok else 1
    print(program.describe())
    print(f"schedule ({label}): {schedule.describe()}")
    print(f"baseline : {base.summary()}")
    print(f"scheduled: {tuned.summary()}  [{tuned.threads} thread(s), {tuned.runtime}]")
    if tuned.ok:
        gain = speedup(base, tuned)
        print(f"speedup  : {gain:.1f}x" if gain else "speedup  : n/a (baseline failed)")
        print(f"GFLOP/s  : {tuned.gflops:.2f}" if tuned.gflops else "GFLOP/s  : n/a")
    print(f"verified : {tuned.verified} (max error {tuned.max_error}, tolerance {tuned.tolerance})")
    print(
        f"one measurement took {tuned.wall_s:.2f} s (compile {sum(tuned.compile_s.values()):.2f} s)"
    )
    return 0 if tuned.ok else 1
