"""Command line: `mlirrl-jax measure | demo | suite | show | collect | store | fit-cost-model |
train`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB, DEFAULT_TIMEOUT_S, Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod, speedup
from mlirrl_jax.programs import generate
from mlirrl_jax.programs.ir import Program, ProgramError, load_program, parse_program
from mlirrl_jax.report import format_table, save_speedup_plot
from mlirrl_jax.schedule import Schedule, ScheduleError
from mlirrl_jax.shipped import SHIPPED_SEEDS, SHIPPED_SURROGATE
from mlirrl_jax.splits import SPLITS
from mlirrl_jax.transform import transform_script

# The demo's programs: the shapes its figures are known by, rendered by the generator.
DEMO_SPECS = (
    generate.MatmulSpec(256, 256, 256),
    generate.Conv2dSpec("nhwc", 1, 34, 34, 32, 64, 3),
    generate.MatmulBiasReluSpec(256, 256, 256),
    generate.PoolSpec("max", 1, 34, 34, 64, 3),
    generate.ElementwiseSpec("relu", (1, 56, 56, 64)),
    generate.BatchMatmulSpec(4, 128, 128, 64),
)


def demo_programs() -> list[Program]:
    return [parse_program(generate.render(spec), spec.name) for spec in DEMO_SPECS]


def _measurement_row(program: Program, base: Measurement, tuned: Measurement) -> dict:
    gain = speedup(base, tuned)
    return {
        "program": program.name,
        "baseline_ms": base.median_s * 1e3 if base.ok else None,
        "scheduled_ms": tuned.median_s * 1e3 if tuned.ok else None,
        "speedup": gain,
        "gflops": tuned.gflops,
        "verified": tuned.verified,
        "status": tuned.status if tuned.ok else f"{tuned.status}: {(tuned.error or '')[:80]}",
        "measure_s": tuned.wall_s,
    }


def _runner(args: argparse.Namespace) -> Runner:
    return Runner(timeout_s=args.timeout, mem_limit_mb=args.mem_limit)


def cmd_measure(args) -> int:
    program = load_program(args.program)
    if args.schedule:
        schedule, label = Schedule.load(args.schedule), args.schedule
    else:
        schedule, label = heuristic_schedule(program), "heuristic schedule"
    method = TimingMethod(seed=args.seed)
    with _runner(args) as runner:
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


def cmd_demo(args) -> int:
    from mlirrl_jax.host_devices import use_compilation_cache, use_host_devices

    if args.agent_minutes > 0 and args.out and (Path(args.out) / "agent" / "checkpoints").exists():
        raise ValueError(f"{args.out}/agent already holds an agent run: choose another --out")
    use_host_devices()  # before any JAX work: the agent's environments use every core
    use_compilation_cache()
    out_dir = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    programs = [load_program(p) for p in args.programs] if args.programs else demo_programs()
    rows, records = [], []
    started = time.perf_counter()
    print(f"measuring {len(programs)} programs, unscheduled and with the heuristic schedule")
    with _runner(args) as runner:
        for index, program in enumerate(programs, 1):
            schedule = heuristic_schedule(program)
            base = runner.measure(program, None, method=TimingMethod(seed=args.seed))
            tuned = runner.measure(
                program,
                schedule,
                threads=args.threads,
                runtime=args.runtime,
                method=TimingMethod(seed=args.seed),
            )
            rows.append(_measurement_row(program, base, tuned))
            records.append(
                {
                    "program": program.name,
                    "schedule": schedule.to_json(),
                    "baseline": base.to_json(),
                    "scheduled": tuned.to_json(),
                }
            )
            elapsed = time.perf_counter() - started
            eta = elapsed / index * (len(programs) - index)
            print(
                f"  [{index}/{len(programs)}] {program.name}: {tuned.summary()}"
                f"  ({elapsed:.0f} s elapsed, ~{eta:.0f} s left)",
                flush=True,
            )
    table = format_table(rows)
    print()
    print(table)
    (out_dir / "results.json").write_text(json.dumps(records, indent=1))
    (out_dir / "results.md").write_text(
        f"# Demo: unscheduled vs heuristic schedule\n\ncommand: `mlirrl-jax {' '.join(sys.argv[1:])}`\n\n"
        + table
        + "\n"
    )
    plot = save_speedup_plot(rows, out_dir / "speedup.png")
    print(f"\nresults: {out_dir}/results.md, results.json" + (f", {plot.name}" if plot else ""))
    if args.surrogate_metrics:
        _demo_surrogate(out_dir)
    agent_ok = _demo_agent(out_dir, args)
    return 0 if all(r["verified"] for r in rows) and agent_ok else 1


def _demo_surrogate(out_dir: Path) -> None:
    """Load the shipped surrogate and print its metrics on its held-out programs."""
    from cost_model.report import evaluate_saved, format_metrics
    from mlirrl_jax.measure.fingerprint import machine_fingerprint

    seeds = sorted(SHIPPED_SEEDS.glob("*.parquet"))
    if not (SHIPPED_SURROGATE / "model.json").is_file() or not seeds:
        print(
            "\nno shipped surrogate yet (data/cost_model): collect measurements with "
            "`mlirrl-jax collect` and train one with `mlirrl-jax fit-cost-model`"
        )
        return
    print(
        f"\nsurrogate cost model {SHIPPED_SURROGATE}, evaluated on its held-out programs "
        f"with the seed dataset {seeds[0].name}:"
    )
    result = evaluate_saved(SHIPPED_SURROGATE, seeds[0])
    print(format_metrics(result))
    print(
        f"({result['held_out_rows']} schedules of {result['held_out_programs']} held-out programs)"
    )
    (out_dir / "surrogate_metrics.json").write_text(json.dumps(result, indent=1))
    here = machine_fingerprint()["machine_id"]
    if result["machine_id"] != here:
        print(
            f"note: the shipped model was trained on machine {result['machine_id']}; this is "
            f"{here}. Its predictions are not valid here: collect this machine's own data."
        )


def _demo_agent(out_dir: Path, args) -> bool:
    """Train the agent on the shipped surrogate, then measure its schedules of some test
    programs for real against the heuristic; says whether every measurement verified."""
    if args.agent_minutes <= 0 or not (SHIPPED_SURROGATE / "model.json").is_file():
        return True
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.agent.run import run_training
    from mlirrl_jax.agent.train import AgentConfig
    from mlirrl_jax.splits import TEST, entries
    from mlirrl_jax.validate import (
        format_report,
        measure_against_baselines,
        pick_evenly,
        save_plot,
        summarize,
    )

    run = out_dir / "agent"
    print(f"\ntraining the agent on the shipped surrogate for {args.agent_minutes:g} minutes")
    run_training(run, AgentConfig(minutes=args.agent_minutes))
    chosen = pick_evenly(entries(TEST, ("dl-v0",)), args.agent_programs)
    programs = [parse_program(e.text, e.uri) for e in chosen]
    print(f"\nthe agent's greedy schedules of {len(programs)} dl-v0 test programs, measured:")
    agent = Agent.load(run)
    with _runner(args) as runner:
        rows = measure_against_baselines(
            agent, programs, runner, TimingMethod(seed=args.seed), progress=print
        )
    summary = summarize(rows)
    report = format_report(rows, summary)
    print(report)
    (out_dir / "agent_real.md").write_text(
        f"# The agent (trained {args.agent_minutes:g} min) vs the heuristic, measured\n\n"
        + report
        + "\n"
    )
    (out_dir / "agent_real.json").write_text(
        json.dumps({"summary": summary, "rows": rows}, indent=1)
    )
    save_plot(rows, out_dir / "agent_real.png")
    print(f"\nagent run: {run} (learning_curve.png); {out_dir}/agent_real.md, agent_real.png")
    return all(r["verified"] for r in rows)


def cmd_suite(args) -> int:
    from mlirrl_jax.programs import suites
    from mlirrl_jax.splits import split_of

    entries = suites.suite(args.name)
    if args.split:
        entries = [e for e in entries if split_of(e.uri) == args.split]
    if args.kind:
        entries = [e for e in entries if e.kind == args.kind]
    for e in entries:
        print(f"{e.uri}\t{e.kind}\t{e.model}\t{split_of(e.uri)}\t{e.flops / 1e6:.1f} MFLOP")
    print(f"{len(entries)} programs", file=sys.stderr)
    return 0


def cmd_show(args) -> int:
    program = load_program(args.program)
    print(program.describe())
    schedule = None
    if args.agent:
        from mlirrl_jax.agent.agent import Agent

        agent = Agent.load(args.agent)
        best = agent.scored_schedules([program], n=args.n)[0]
        for rank, scored in enumerate(best, 1):
            print(
                f"\nagent schedule {rank}/{len(best)} ({args.agent}): predicted "
                f"{scored.predicted_speedup:.2f}x by the surrogate of machine "
                f"{agent.surrogate.machine_id or '-'}: {scored.schedule.describe()}"
            )
        schedule = best[0].schedule
    elif args.schedule or args.heuristic:
        schedule = Schedule.load(args.schedule) if args.schedule else heuristic_schedule(program)
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


def cmd_collect(args) -> int:
    from mlirrl_jax.collect import CollectConfig, CollectionJob

    config = CollectConfig(
        store=Path(args.store),
        suite=args.suite,
        split=args.split,
        budget=args.budget,
        hours=args.hours,
        workers=args.workers,
        threads=args.threads,
        seed=args.seed,
        next_weight=args.next_weight,
        **({"per_visit": args.per_visit} if args.per_visit else {}),
        backend=args.backend,
        address=args.address,
        timeout_s=args.timeout,
        mem_limit_mb=args.mem_limit,
        max_programs=args.max_programs,
        max_mflops=args.max_mflops,
        inject_faults=tuple(f for f in (args.inject_faults or "").split(",") if f),
    )
    job = CollectionJob(config)
    print(
        f"collecting into {job.store.path} on machine {job.machine}: "
        f"{len(job.programs)} {args.split} programs, {job.stored_for_split()} rows already stored",
        file=sys.stderr,
    )
    report = job.run()
    print(
        f"measured {report.measured} in {report.seconds:.0f} s ({report.rate:.2f}/s), "
        f"{report.new_rows} new rows, {report.failures} failures {report.by_status}; "
        f"{report.stored_for_split} rows for the {args.split} split"
    )
    return 0


def cmd_store(args) -> int:
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.store import MeasurementStore

    with MeasurementStore(args.store) as store:
        if args.action == "summary":
            print(json.dumps(store.summary(), indent=1))
        elif args.action == "export":
            print(f"exported {store.export_parquet(args.file)} rows to {args.file}")
        elif args.action == "import":
            new = store.import_parquet(args.file, allow_other_machines=args.allow_other_machines)
            print(f"imported {new} new rows from {args.file}")
        elif args.action == "card":
            machine = args.machine or machine_fingerprint()["machine_id"]
            text = store.card(machine, args.title, args.command or "")
            Path(args.file).write_text(text) if args.file else print(text)
    return 0


def cmd_fit_cost_model(args) -> int:
    from cost_model.model import ModelConfig
    from cost_model.report import fit_and_report, format_metrics
    from cost_model.train import TrainConfig
    from mlirrl_jax.measure.fingerprint import machine_fingerprint

    def given(*names: str) -> dict:  # options left unset keep the dataclasses' defaults
        return {n: getattr(args, n) for n in names if getattr(args, n) is not None}

    config = TrainConfig(
        seed=args.seed,
        **given(
            "epochs",
            "max_steps",
            "feature_noise",
            "teacher",
            "teacher_rounds",
            "teacher_leaves",
            "teacher_members",
            "teacher_op_width",
            "distill_states",
            "distill_epochs",
            "distill_max_steps",
        ),
        model=ModelConfig(seed=args.seed, **given("op_width", "heads", "members")),
    )
    machine = args.machine or machine_fingerprint()["machine_id"]
    result = fit_and_report(Path(args.store), Path(args.out), machine, config)
    print(format_metrics(result))
    print(
        f"trained in {result['fit_seconds']:.0f} s on {result['train_rows']} rows; held out "
        f"{result['held_out_programs']} programs ({result['held_out_rows']} rows); "
        f"model, metrics.json and predicted_vs_measured.png in {Path(args.out).resolve()}"
    )
    return 0


def cmd_train(args) -> int:
    from mlirrl_jax.host_devices import use_compilation_cache, use_host_devices

    use_host_devices()  # every core an XLA device: the environments are split across them
    use_compilation_cache()
    from mlirrl_jax.agent.run import run_training
    from mlirrl_jax.agent.train import AgentConfig

    out = Path(args.out)
    budget = {}
    if args.minutes is not None:
        budget = {"minutes": args.minutes, "iterations": 0}
    elif args.iterations is not None:
        budget = {"iterations": args.iterations}
    config = (
        AgentConfig.from_json(json.loads(Path(args.config).read_text())) if args.config else None
    )
    if args.surrogate is not None:
        if args.resume:
            raise ValueError("a resumed run keeps its surrogate: drop --surrogate")
        config = replace(config or AgentConfig(), surrogate=args.surrogate)
    run_training(out, config, resume=args.resume, budget=budget, regrounding=_rounds(args))
    print(f"run in {out.resolve()}: metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    return 0


REGROUNDING_FLAGS = (
    "rounds",
    "real_budget",
    "round_programs",
    "top_k",
    "iterations_per_round",
    "selection",
    "update",
    "store",
)


def _rounds(args):
    """The re-grounding of a `train` command: from its flags, or a resumed run's own."""
    from mlirrl_jax.regrounding import RegroundConfig, rounds

    given = {f: getattr(args, f) for f in REGROUNDING_FLAGS if getattr(args, f) is not None}
    flags = list(given)
    if args.regrounding_config:
        given = {**json.loads(Path(args.regrounding_config).read_text()), **given}
        flags.append("regrounding_config")
    if args.resume:
        if given:
            raise ValueError(f"a resumed run keeps its re-grounding settings: drop {_flags(flags)}")
        return rounds(None)
    if not given.get("rounds"):
        if given:
            raise ValueError(f"{_flags(flags)}: re-grounding needs rounds > 0 (--rounds N)")
        return None
    return rounds(RegroundConfig.from_json(given))


def _flags(names) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in names)


def _add_measure_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1, help="threads for the scheduled kernel")
    parser.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", "async", "openmp"],
        help="parallel runtime when --threads > 1 (auto: OpenMP if installed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one measurement may take before its worker is killed",
    )
    parser.add_argument(
        "--mem-limit",
        type=int,
        default=DEFAULT_MEM_LIMIT_MB,
        help="worker address-space limit in MiB",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlirrl-jax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("measure", help="measure a program unscheduled and with a schedule")
    p.add_argument("program", help="suite:// URI, .mlir file")
    p.add_argument("--schedule", help="schedule JSON file (default: the heuristic schedule)")
    p.add_argument("--json", action="store_true", help="print both measurements as JSON")
    _add_measure_options(p)
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser("demo", help="the main job: built-in programs, unscheduled vs scheduled")
    p.add_argument("programs", nargs="*", help="programs (default: a built-in selection)")
    p.add_argument("--out", help="output folder (default: runs/demo-<time>)")
    p.add_argument(
        "--agent-minutes",
        type=float,
        default=2.0,
        help="minutes of agent training on the shipped surrogate (0: skip the agent)",
    )
    p.add_argument(
        "--agent-programs", type=int, default=8, help="test programs the agent is measured on"
    )
    p.add_argument(
        "--surrogate-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-evaluate the shipped surrogate on its held-out programs (about a minute)",
    )
    _add_measure_options(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("collect", help="measure sampled schedules into the measurement store")
    p.add_argument("--store", default="data/measurements.db")
    p.add_argument("--suite", default="dl-v0")
    p.add_argument(
        "--split",
        default="train",
        choices=["train", "test"],
        help="the suite's own split: train (its non-test programs: the named train and "
        "surrogate-validation splits, mlirrl_jax.splits) or test",
    )
    limit = p.add_mutually_exclusive_group(required=True)
    limit.add_argument("--budget", type=int, help="stop at this many stored rows for the split")
    limit.add_argument("--hours", type=float, help="stop after this many hours")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--next-weight",
        type=float,
        default=0.25,
        help="probability weight of moving to the next op (1: uniform sampling)",
    )
    p.add_argument(
        "--per-visit",
        type=int,
        help="schedules of a program measured in a row, its reference outputs cached "
        "(default: CollectConfig.per_visit)",
    )
    p.add_argument("--backend", default="local", choices=["local", "ray"])
    p.add_argument("--address", help="Ray cluster address, e.g. 127.0.0.1:6379")
    p.add_argument("--max-programs", type=int, help="only the first N programs of the split")
    p.add_argument("--max-mflops", type=float, help="only programs of at most this many MFLOP")
    p.add_argument("--inject-faults", help=argparse.SUPPRESS)  # testing: crash,hang,wrong_output
    _add_measure_options(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("store", help="summarize, export or import a measurement store")
    p.add_argument("action", choices=["summary", "export", "import", "card"])
    p.add_argument("file", nargs="?", help="Parquet file (export/import), Markdown file (card)")
    p.add_argument("--machine", help="machine id for the card (default: this one)")
    p.add_argument("--title", default="Measurement dataset")
    p.add_argument("--command", help="the command that collected the data, for the card")
    p.add_argument("--store", default="data/measurements.db")
    p.add_argument("--allow-other-machines", action="store_true")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("fit-cost-model", help="train the surrogate on a measurement store")
    p.add_argument("--store", default="data/measurements.db")
    p.add_argument("--out", default=f"runs/cost-model-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--machine", help="machine id whose measurements to use (default: this one)")
    # unset: the defaults of cost_model.train.TrainConfig and cost_model.model.ModelConfig
    p.add_argument("--epochs", type=int, help="passes over the training rows")
    p.add_argument(
        "--max-steps",
        type=int,
        help="at most this many batches per network of a networks teacher (0: no cap)",
    )
    p.add_argument("--op-width", type=int, help="width of the op tokens")
    p.add_argument("--heads", type=int, help="attention heads across ops (0: none)")
    p.add_argument("--members", type=int, help="networks of the shipped model, averaged")
    p.add_argument("--feature-noise", type=float, help="std of training noise on features")
    p.add_argument(
        "--teacher",
        help="what labels random states for the shipped network: trees (boosted), networks "
        "(an ensemble), or none (the network learns from the measurements alone)",
    )
    p.add_argument("--teacher-rounds", type=int, help="trees the trees teacher boosts")
    p.add_argument("--teacher-leaves", type=int, help="leaves per tree of the trees teacher")
    p.add_argument("--teacher-members", type=int, help="networks of a networks teacher")
    p.add_argument("--teacher-op-width", type=int, help="op token width of a networks teacher")
    p.add_argument("--distill-states", type=int, help="random states the teacher labels")
    p.add_argument("--distill-epochs", type=int, help="passes of the distilled network")
    p.add_argument(
        "--distill-max-steps",
        type=int,
        help="at most this many batches for the distilled network (0: no cap)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_fit_cost_model)

    p = sub.add_parser("suite", help="list a built-in suite's programs")
    p.add_argument("--name", default="dl-v0")
    p.add_argument("--split", choices=list(SPLITS))
    p.add_argument("--kind")
    p.set_defaults(func=cmd_suite)

    p = sub.add_parser("show", help="describe a program; print a schedule's transform script")
    p.add_argument("program")
    p.add_argument("--schedule", help="schedule JSON file")
    p.add_argument("--heuristic", action="store_true", help="show the heuristic schedule")
    p.add_argument("--mlir", action="store_true", help="print the normalized kernel")
    p.add_argument("--agent", help="a training run folder: show its agent's schedule")
    p.add_argument("-n", type=int, default=1, help="with --agent: the n best distinct schedules")
    p.add_argument("--save", help="write the shown schedule's JSON to this file")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("train", help="train the PPO agent on the surrogate (simulated reward)")
    p.add_argument("--out", required=True, help="the run folder, e.g. runs/NAME")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, help="training time (default: the config's)")
    budget.add_argument("--iterations", type=int, help="PPO iterations instead of a time")
    p.add_argument("--config", help="JSON file of AgentConfig fields (the rest: defaults)")
    p.add_argument("--surrogate", help="cost model folder, or 'analytic' (default: shipped)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    ground = p.add_argument_group(
        "re-grounding",
        "measure the agent's top schedules on this machine and correct the "
        "surrogate between stretches of training (on with --rounds N > 0; a resumed run keeps "
        "its own settings)",
    )
    ground.add_argument("--rounds", type=int, help="re-grounding rounds (default 0: none)")
    ground.add_argument("--real-budget", type=int, help="real measurements in all (2000)")
    ground.add_argument("--round-programs", type=int, help="programs measured per round (16)")
    ground.add_argument("--top-k", type=int, help="schedules per program per round (8)")
    ground.add_argument("--iterations-per-round", type=int, help="PPO iterations per round (60)")
    ground.add_argument("--selection", choices=["gain", "uniform"], help="program choice (gain)")
    ground.add_argument(
        "--update",
        choices=["measured", "anchored", "residual"],
        help="what an update learns from (see RegroundConfig.update; default residual)",
    )
    ground.add_argument("--store", help="measurement store (data/measurements.db)")
    ground.add_argument(
        "--regrounding-config", help="JSON file of RegroundConfig fields (flags override it)"
    )
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ProgramError, ScheduleError, KeyError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
