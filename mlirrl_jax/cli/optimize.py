"""`mlirrl-jax optimize KERNEL --out DIR`: the agent on a kernel of the user's own
(`mlirrl_jax.optimize.optimize`)."""

from __future__ import annotations

import logging

# the option groups every measuring command shares
from mlirrl_jax.cli.options import (
    POSITIVE_INT,
    add_phase_limits,
    add_worker_options,
    given,
    module_constant,
    refuse_without,
    worker_settings,
)
from mlirrl_jax.runfolder import run_folder

log = logging.getLogger("mlirrl_jax.optimize")


def register(sub) -> None:
    p = sub.add_parser("optimize", help="optimize your own MLIR kernel with the trained agent")
    p.add_argument("kernel", help="an .mlir file (named Linalg ops, linalg.generic, chains)")
    p.add_argument("--out", required=True, help="folder for the schedule, script, MLIR, summary")
    p.add_argument("--budget", type=POSITIVE_INT, default=8, help="the agent's top-k measured (8)")
    p.add_argument(
        "--threads", type=POSITIVE_INT, default=1, help="threads of the scheduled kernel (1)"
    )
    p.add_argument("--run", help="the agent's run (default: adapted to this machine, else shipped)")
    p.add_argument(
        "--start",
        choices=module_constant("mlirrl_jax.agent.config:STARTS"),
        default="known",
        help="known (default): the agent proposes the heuristic's schedule and refinements of "
        "it beside its own schedules; scratch: its own only",
    )
    p.add_argument(
        "--search",
        choices=module_constant("mlirrl_jax.optimize:SEARCHES"),
        default="none",
        help="also run a search beside the agent: evolutionary (mutations of the best "
        "measured schedules, ranked by the agent's surrogate, fine-tuned between batches)",
    )
    p.add_argument(
        "--search-budget", type=POSITIVE_INT, help="real measurements of the search (64)"
    )
    add_worker_options(p)
    add_phase_limits(p)
    p.set_defaults(func=run)


def run(args) -> int:
    refuse_without(args, "--search-budget", "--search evolutionary", args.search != "none")
    from mlirrl_jax.optimize import optimize

    # summary.json is written last: a folder holding it has a result to keep
    with run_folder(args.out, lambda out: (out / "summary.json").is_file(), args.command_line):
        # each flag to the parameter of its name
        summary = optimize(
            args.kernel,
            args.out,
            budget=args.budget,
            threads=args.threads,
            run=args.run,
            **worker_settings(args),
            say=log.info,
            compile_timeout_s=args.compile_timeout,
            reference_timeout_s=args.reference_timeout,
            search=args.search,
            **given(args, ("search_budget",)),
            start=args.start,
        )
    if summary.speedup is None:
        gain = f"unscheduled over the {args.timeout:g} s limit, so no speedup over it"
    else:
        gain = f"{summary.speedup:.2f}x over unscheduled"
    print(
        f"best: {summary.best_source}, {summary.best_ms:.3f} ms, {gain}"
        + (f", {summary.over_heuristic:.2f}x the heuristic" if summary.over_heuristic else "")
        + f" (verified); {summary.schedule}"
    )
    print(f"wrote {args.out}: schedule.json, transform.mlir, transformed.mlir, summary.json")
    print(f"replay: {summary.replay}")
    return 0
