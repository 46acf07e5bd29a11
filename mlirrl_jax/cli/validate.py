"""`mlirrl-jax validate [FILES]`: the agent's schedules against the heuristic, random search,
the surrogate's own pick, the evolutionary search and XLA, measured on this machine
(`mlirrl_jax.validation.Validation`); resumable."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mlirrl_jax.cli.options import (
    POSITIVE_INT,
    add_field_flags,
    add_selection_options,
    add_worker_options,
    given,
    module_constant,
    thread_counts,
    worker_settings,
)
from mlirrl_jax.runfolder import check_inputs, run_folder

FIELDS = (
    "random_factor",
    "guided_samples",
    "evolutionary_budget",
    "agent_start",
    "xla",
    "store",
    "also",
)


def register(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="the agent's schedules against heuristic, random search and XLA, measured here",
    )
    p.add_argument("files", nargs="*", help="programs (default: --suite dl-v0 --split test)")
    p.add_argument(
        "--run",
        action="append",
        help="the agent's run (default: adapted to this machine at each thread count, else "
        "shipped); repeat it to give one run per thread count, each matched by the threads its "
        "surrogate was adapted at",
    )
    add_selection_options(p)
    p.add_argument("--threads", type=thread_counts, default=(1, 2), help="e.g. 1,2 (default)")
    p.add_argument(
        "--budget", type=POSITIVE_INT, default=8, help="k: real measurements of top-k (8)"
    )
    add_field_flags(
        p,
        "mlirrl_jax.validation.config:ValidationConfig",
        FIELDS,
        types={"random_factor": POSITIVE_INT, "guided_samples": POSITIVE_INT},
        choices={"agent_start": list(module_constant("mlirrl_jax.agent.config:STARTS"))},
    )
    p.add_argument("--out", help="report folder (default: the run's, or runs/validate-<time>)")
    add_worker_options(p)
    p.set_defaults(func=run)


def _has_rows(out: Path) -> bool:
    """Whether a report folder holds a whole result line of `Validation.rows_path`, which a
    rerun resumes from (validation.py imports JAX: not read from there before the lock)."""
    rows = out / "validation.jsonl"
    return rows.is_file() and b"\n" in rows.read_bytes()


def _report_folder(args, runs: dict[int, Path] | None) -> Path:
    """--out, else the agent's run if one run serves every thread count and lies under a runs/
    folder, else runs/validate-<time>."""
    if args.out:
        return Path(args.out)
    if runs and len(set(runs.values())) == 1:
        first = runs[args.threads[0]]
        if "runs" in first.resolve().parts:
            return first
    return Path(f"runs/validate-{time.strftime('%Y%m%d-%H%M%S')}")


def run(args) -> int:
    """Holding the report folder: the inputs and the folder are checked and a second process
    on it refused before JAX starts; a start that fails before any result leaves nothing."""
    from mlirrl_jax.adopted import default_agent_run, runs_for_threads
    from mlirrl_jax.programs.select import choose_programs

    given_runs = args.run or []
    check_inputs(files=args.files, runs=given_runs)
    # one run or none: the report folder is known without reading checkpoints
    one = len(given_runs) < 2
    runs = runs_for_threads(given_runs, args.threads, default_agent_run) if one else None
    out = _report_folder(args, runs)
    with run_folder(out, keep=_has_rows, command=args.command_line):
        from mlirrl_jax.host_devices import use_compilation_cache

        use_compilation_cache()
        runs = runs or runs_for_threads(given_runs, args.threads)
        programs = choose_programs(
            args.files, args.suite, args.split, args.kind, args.max_mflops, args.programs
        )
        return _validate(args, runs, programs, out)


def _validate(args, runs: dict[int, Path], programs, out: Path) -> int:
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.agent.surrogate import check_this_machine
    from mlirrl_jax.measure.profile import this_machine_profile
    from mlirrl_jax.optimize import check_program
    from mlirrl_jax.validation import Validation, ValidationConfig

    for program in programs:
        check_program(program)
    config = ValidationConfig(
        threads=args.threads,
        budget=args.budget,
        **worker_settings(args),
        **given(args, FIELDS),
    )
    loaded = {run: Agent.load(run) for run in set(runs.values())}
    for run, agent in loaded.items():
        check_this_machine(agent.surrogate, [t for t, r in runs.items() if r == run])
    agents = {t: loaded[run] for t, run in runs.items()}
    for t, run in runs.items():
        print(
            f"at {t} thread(s): the agent {run} (surrogate of machine "
            f"{agents[t].surrogate.machine_id or '-'} at {agents[t].surrogate.threads} "
            "thread(s))",
            file=sys.stderr,
        )
    print(
        f"validating on {len(programs)} programs at {list(config.threads)} thread(s), "
        f"k = {config.budget}; report in {out}",
        file=sys.stderr,
    )
    validation = Validation(
        agents, programs, out, config, agent_run={t: str(r) for t, r in runs.items()}
    )
    validation.report(validation.run(), this_machine_profile().fma_peak_gflops)
    print((out / "validation.md").read_text())
    print(
        f"report: {out}/validation.md, validation.json, validation_speedups.png, "
        "validation_cdf.png, validation_predicted.png",
        file=sys.stderr,
    )
    return 0
