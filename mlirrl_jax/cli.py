"""Command line: `mlirrl-jax measure | demo | suite | show | collect | store | fit-cost-model |
train`."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sqlite3
import sys
import time
from dataclasses import replace
from pathlib import Path

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.interrupt import stop_on_ctrl_c
from mlirrl_jax.measure.runner import (
    DEFAULT_COMPILE_TIMEOUT_S,
    DEFAULT_MEM_LIMIT_MB,
    DEFAULT_REFERENCE_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    Runner,
)
from mlirrl_jax.measure.timing import Measurement, TimingMethod, speedup
from mlirrl_jax.programs import generate
from mlirrl_jax.programs.ir import Program, ProgramError, load_program, parse_program
from mlirrl_jax.runfolder import check_inputs, command_line, has_checkpoint, run_folder
from mlirrl_jax.schedule import Schedule, ScheduleError
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


def cmd_measure(args) -> int:
    program = load_program(args.program)
    schedule, label = schedule_to_measure(args, program)
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


DEMO_VALIDATION = (  # held-out dl-v0 test programs of several kinds, small enough for minutes
    "suite://dl-v0/matmul_m32_n1000_k512",
    "suite://dl-v0/conv2d_nhwc_n1_h56_w56_c64_f128_k1_s2_d1",
    "suite://dl-v0/conv_bias_relu_n1_h28_w28_c32_f192_k1_s1_d1",
    "suite://dl-v0/depthwise_n1_h30_w30_c192_k3_s1_d1",
    "suite://dl-v0/pool_max_n1_h56_w56_c256_k2_s2_d1",
    "suite://dl-v0/relu_1x56x56x256",
)
DEMO_REGROUNDING = {  # a short re-grounding: a few hundred measurements of this machine
    "rounds": 2,
    "iterations_per_round": 30,
    "round_programs": 12,
    "top_k": 6,
    "real_budget": 400,
    "track_programs": 6,
    "heldout_programs": 6,
    "heldout_every": 1,
    "calibration_programs": 16,
    "validation_programs": 8,
    "validation_k": 6,
}


def cmd_demo(args) -> int:
    """The main job: adapt the shipped surrogate and agent to this machine (a short
    re-grounding while training on from the shipped agent), then validate the adapted agent
    on held-out programs against unscheduled code, the heuristic, random search and XLA.
    Its folder and the agent's run in it are held as `train` holds a run's, and the
    validation programs are read before minutes of adapting."""
    out_dir = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run = out_dir / "agent"
    with (
        run_folder(out_dir, keep=lambda _: has_checkpoint(run), command=args.command_line),
        run_folder(run, keep=has_checkpoint, command=args.command_line),
    ):
        if (run / "checkpoints").exists():
            raise ValueError(f"{run} already holds an agent run: choose another --out")
        programs = [load_program(p) for p in (args.programs or DEMO_VALIDATION)]
        return _demo(args, out_dir, programs)


def _demo(args, out_dir: Path, programs: list[Program]) -> int:
    from mlirrl_jax.host_devices import use_compilation_cache, use_host_devices

    run = out_dir / "agent"
    use_host_devices()  # before any JAX work: the agent's environments use every core
    use_compilation_cache()
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.agent.checkpoint import load_meta
    from mlirrl_jax.agent.run import run_training
    from mlirrl_jax.agent.train import AgentConfig
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.measure.peak import fma_peak_gflops
    from mlirrl_jax.optimize import adopt_agent_run
    from mlirrl_jax.regrounding import RegroundConfig, rounds
    from mlirrl_jax.shipped import SHIPPED_AGENT
    from mlirrl_jax.validation import Validation, ValidationConfig

    started = time.perf_counter()
    here = machine_fingerprint()["machine_id"]
    shipped = (SHIPPED_AGENT / "checkpoints").is_dir()
    config = AgentConfig.from_json(load_meta(SHIPPED_AGENT)["config"]) if shipped else AgentConfig()
    settings = {**DEMO_REGROUNDING, "store": args.store}
    if args.rounds is not None:
        settings["rounds"] = args.rounds
    if args.real_budget is not None:
        settings["real_budget"] = args.real_budget
    regrounding = RegroundConfig.from_json(settings)
    iterations = args.iterations or regrounding.rounds * regrounding.iterations_per_round + 30
    print(
        f"machine {here}: adapting the {'shipped agent' if shipped else 'a new agent'} and the "
        f"shipped surrogate to it ({regrounding.rounds} re-grounding rounds, at most "
        f"{regrounding.real_budget} real measurements into {regrounding.store}; "
        f"{iterations} PPO iterations); run in {run}",
        flush=True,
    )
    if shipped:  # go on as the shipped run ended: its final step size and entropy bonus
        config = replace(
            config,
            learning_rate=config.final_learning_rate,
            entropy_coef=config.final_entropy_coef,
        )
    run_training(
        run,
        replace(config, minutes=0.0, iterations=iterations),
        regrounding=rounds(regrounding),
        init_agent=SHIPPED_AGENT if shipped else None,
    )
    adopt_agent_run(run, regrounding.threads)
    adapted_s = time.perf_counter() - started
    print(
        (run / "regrounding" / "rounds.md").read_text()
        if (run / "regrounding" / "rounds.md").is_file()
        else ""
    )
    print(
        f"\nadapted in {adapted_s / 60:.1f} min; `mlirrl-jax optimize` now uses this agent on this "
        f"machine. Validating it on {len(programs)} held-out programs:",
        flush=True,
    )
    validation = Validation(
        Agent.load(run),
        programs,
        out_dir,
        ValidationConfig(
            threads=args.threads,
            budget=args.budget,
            guided_samples=max(64, args.budget),
            timeout_s=args.timeout,
            mem_limit_mb=args.mem_limit,
            seed=args.seed,
            store=args.store,
        ),
        agent_run=str(run),
    )
    rows = validation.run()
    summary = validation.report(rows, fma_peak_gflops())
    print((out_dir / "validation.md").read_text())
    print(
        f"whole pipeline in {(time.perf_counter() - started) / 60:.1f} min. Report: "
        f"{out_dir}/validation.md, validation.json, validation_*.png; re-grounding: "
        f"{run}/regrounding/rounds.md, onpolicy_error.png, predicted_vs_real.png"
    )
    return 0 if summary["threads"] and not _methods_without_result(rows) else 1


def _methods_without_result(rows: list[dict]) -> list[str]:
    """The (program, method) pairs of a validation with no verified result, said on stderr.
    A candidate schedule that crashed, timed out or computed a wrong output is a recorded
    result, not a failure of the run: only a method left with nothing verified is."""
    for r in rows:
        if r["failed"] or r["unverified"]:
            what = [*r["failed"], *(["unverified"] if r["unverified"] else [])]
            print(
                f"{r['program']} at {r['threads']} thread(s): candidate schedules ended "
                f"{', '.join(what)} (recorded in validation.jsonl: results, not failures)",
                file=sys.stderr,
            )
    missing = [
        f"{r['program']} ({method}: {entry['status']})"
        for r in rows
        for method, entry in r["methods"].items()
        if entry["ms"] is None and entry["status"] != "not available for this program"
    ]
    for line in missing:
        print(f"no verified result: {line}", file=sys.stderr)
    return missing


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


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        cpus = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected core numbers, e.g. 0 or 0,1"
        ) from None
    if any(c < 0 for c in cpus):
        raise argparse.ArgumentTypeError(f"{text!r}: core numbers are >= 0")
    return cpus


def cmd_collect(args) -> int:
    from mlirrl_jax.collect import CollectConfig, CollectionJob, parse_mix

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
        **({"mix": parse_mix(args.mix)} if args.mix else {}),
        agent=Path(args.agent) if args.agent else None,
        surrogate=Path(args.surrogate) if args.surrogate else None,
        candidates=args.candidates,
        measure_cpus=args.measure_cpus or (),
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
        f"{report.new_rows} new rows, {report.failures} failures {report.by_status}, "
        f"{report.skipped} skipped (claimed or stored by another job); "
        f"{report.stored_for_split} rows for the {args.split} split"
    )
    return 0


def cmd_store(args) -> int:
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.store import MeasurementStore

    with MeasurementStore(args.store, create=args.action == "import") as store:
        if args.action == "summary":
            print(json.dumps(store.summary(), indent=1))
        elif args.action == "export":
            print(f"exported {store.export_parquet(args.file, args.machine)} rows to {args.file}")
        elif args.action == "import":
            done = store.import_parquet(args.file, allow_other_machines=args.allow_other_machines)
            print(
                f"imported {args.file}: {done.new} new rows, {done.merged} merged into stored "
                f"rows, {done.skipped} skipped (their measurements were imported before)"
            )
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
    if args.machines is not None:  # several machines: asked for by name, or all
        from cost_model.dataset import resolve_machines
        from mlirrl_jax.store import MeasurementStore

        if args.machine:
            raise ValueError("--machine and --machines: give one of them")
        with MeasurementStore(args.store, create=False) as store:
            machine = resolve_machines(store, args.machines)
    else:
        machine = args.machine or machine_fingerprint()["machine_id"]
    threads = list(args.threads) if len(args.threads) > 1 else args.threads[0]
    result = fit_and_report(Path(args.store), Path(args.out), machine, config, threads=threads)
    print(format_metrics(result))
    print(
        f"trained in {result['fit_seconds']:.0f} s on {result['train_rows']} rows; held out "
        f"{result['held_out_programs']} programs ({result['held_out_rows']} rows); "
        f"model, metrics.json and predicted_vs_measured.png in {Path(args.out).resolve()}"
    )
    return 0


def cmd_train(args) -> int:
    """`train`, holding its run folder: before JAX starts, the inputs are checked and a second
    process on the folder is refused; a start that fails before the first checkpoint leaves
    nothing behind."""
    check_inputs(files=(args.config, args.regrounding_config), runs=(args.init_agent,))
    with run_folder(args.out, keep=has_checkpoint, command=args.command_line):
        if args.resume and not has_checkpoint(args.out):  # said before JAX starts
            raise ValueError(f"{args.out}: nothing to resume (no checkpoint in it): drop --resume")
        return _train(args)


def _train(args) -> int:
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
    if args.init_agent and config is None and not args.resume:
        from mlirrl_jax.agent.checkpoint import load_meta

        config = AgentConfig.from_json(load_meta(Path(args.init_agent))["config"])
    if args.surrogate is not None:
        if args.resume:
            raise ValueError("a resumed run keeps its surrogate: drop --surrogate")
        config = replace(config or AgentConfig(), surrogate=args.surrogate)
    if args.uncertainty_penalty is not None:
        if args.resume:
            raise ValueError("a resumed run keeps its reward: drop --uncertainty-penalty")
        config = replace(config or AgentConfig(), uncertainty_penalty=args.uncertainty_penalty)
    if args.train_threads is not None:
        if args.resume:
            raise ValueError("a resumed run keeps its thread counts: drop --train-threads")
        config = replace(config or AgentConfig(), threads=args.train_threads)
    regrounding = _rounds(args)
    if regrounding is not None and regrounding.config is not None and not budget:
        # K iterations before each round and K after the last, whatever the config's budget
        budget = {"iterations": regrounding.config.run_iterations()}
    run_training(
        out,
        config,
        resume=args.resume,
        budget=budget,
        regrounding=regrounding,
        init_agent=args.init_agent,
    )
    print(f"run in {out.resolve()}: metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    if args.adopt:
        from mlirrl_jax.agent.agent import Agent
        from mlirrl_jax.optimize import adopt_agent_run

        threads = Agent.load(out).surrogate.threads
        pointer = adopt_agent_run(out, threads)
        print(f"this machine's agent at {threads} thread(s) is now this run's ({pointer})")
    return 0


def _thread_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads {text!r}: expected e.g. 1 or 1,2") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"--threads {text!r}: thread counts must be >= 1")
    return counts


def _validation_programs(args) -> list[Program]:
    from mlirrl_jax.splits import entries
    from mlirrl_jax.validate import pick_evenly

    if args.files:
        programs = [load_program(f) for f in args.files]
    else:
        chosen = entries(args.split or "test", (args.suite or "dl-v0",))
        if not chosen:
            raise ValueError(
                f"the suite {args.suite or 'dl-v0'} has no {args.split or 'test'} programs"
            )
        programs = [parse_program(e.text, e.uri) for e in chosen]
    if args.kind:
        from mlirrl_jax.validate import program_kind

        programs = [p for p in programs if program_kind(p) in set(args.kind.split(","))]
        if not programs:
            raise ValueError(f"no program of kind {args.kind}")
    if args.max_mflops is not None:
        programs = [p for p in programs if p.flops <= args.max_mflops * 1e6]
        if not programs:
            raise ValueError(f"no program of at most {args.max_mflops:g} MFLOP")
    if args.programs is not None:
        if args.programs < 1:
            raise ValueError(f"--programs must be at least 1, got {args.programs}")
        programs = pick_evenly(programs, args.programs)
    return programs


def _validation_runs(given: list[str], threads, default) -> dict[int, Path]:
    """The agent run for each validation thread count. One --run: it for all. Several: each
    thread count takes the run whose surrogate was adapted at that count, else the one at one
    thread. None: this machine's adapted run at that count (`default(threads)`)."""
    if not given:
        return {t: default(t) for t in threads}
    if len(given) == 1:
        return dict.fromkeys(threads, Path(given[0]))
    from mlirrl_jax.agent.checkpoint import load_meta

    by_threads: dict[int, Path] = {}
    for run in map(Path, given):
        t = int(load_meta(run).get("surrogate", {}).get("threads", 1))
        if t in by_threads:
            raise ValueError(
                f"--run {by_threads[t]} and --run {run} were both adapted at {t} thread(s): "
                "give one run per thread count"
            )
        by_threads[t] = run
    missing = [t for t in threads if t not in by_threads and 1 not in by_threads]
    if missing:
        raise ValueError(
            f"no --run adapted at {missing} thread(s) (nor at one thread): the runs given are "
            + ", ".join(f"{r} ({t} thread(s))" for t, r in sorted(by_threads.items()))
        )
    return {t: by_threads.get(t, by_threads.get(1)) for t in threads}


def _has_validation_rows(out: Path) -> bool:
    """Whether a report folder holds a whole result line of `Validation.rows_path`, which a
    rerun resumes from (validation.py imports JAX: not read from there before the lock)."""
    rows = out / "validation.jsonl"
    return rows.is_file() and b"\n" in rows.read_bytes()


def _validation_out(args, runs: dict[int, Path] | None) -> Path:
    """`validate`'s report folder: --out, else the agent's run if one run serves every thread
    count and lies under a runs/ folder, else runs/validate-<time>."""
    if args.out:
        return Path(args.out)
    if runs and len(set(runs.values())) == 1:
        first = runs[args.threads[0]]
        if "runs" in first.resolve().parts:
            return first
    return Path(f"runs/validate-{time.strftime('%Y%m%d-%H%M%S')}")


def cmd_validate(args) -> int:
    """`validate`, holding its report folder: the inputs and the folder are checked and a
    second process on it refused before JAX starts; a start that fails before any result
    leaves nothing behind."""
    from mlirrl_jax.optimize import default_agent_run

    if args.files and (args.suite or args.split):
        raise ValueError("give programs as FILES or as --suite/--split, not both")
    given = args.run or []
    check_inputs(files=args.files, runs=given)
    # one run or none: the report folder is known without reading checkpoints (JAX)
    runs = _validation_runs(given, args.threads, default_agent_run) if len(given) < 2 else None
    out = _validation_out(args, runs)
    with run_folder(out, keep=_has_validation_rows, command=args.command_line):
        from mlirrl_jax.host_devices import use_compilation_cache

        use_compilation_cache()
        return _validate(args, runs or _validation_runs(given, args.threads, None), out)


def _validate(args, runs: dict[int, Path], out: Path) -> int:
    from mlirrl_jax.agent.agent import Agent
    from mlirrl_jax.measure.peak import fma_peak_gflops
    from mlirrl_jax.optimize import check_program
    from mlirrl_jax.validation import Validation, ValidationConfig

    programs = _validation_programs(args)
    for program in programs:
        check_program(program)
    config = ValidationConfig(
        threads=args.threads,
        budget=args.budget,
        random_factor=args.random_factor,
        guided_samples=args.guided_samples,
        evolutionary_budget=args.evolutionary_budget,
        xla=args.xla,
        seed=args.seed,
        timeout_s=args.timeout,
        mem_limit_mb=args.mem_limit,
        store=args.store,
    )
    loaded = {run: Agent.load(run) for run in set(runs.values())}
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
    names = {t: str(run) for t, run in runs.items()}
    validation = Validation(agents, programs, out, config, agent_run=names)
    rows = validation.run()
    peak = fma_peak_gflops()
    validation.report(rows, peak)
    print((out / "validation.md").read_text())
    print(
        f"report: {out}/validation.md, validation.json, validation_speedups.png, "
        "validation_cdf.png, validation_predicted.png",
        file=sys.stderr,
    )
    return 0


def cmd_optimize(args) -> int:
    from mlirrl_jax.optimize import optimize

    # summary.json is written last: a folder holding it has a result to keep
    with run_folder(args.out, lambda out: (out / "summary.json").is_file(), args.command_line):
        summary = optimize(
            args.kernel,
            args.out,
            budget=args.budget,
            threads=args.threads,
            run=args.run,
            timeout_s=args.timeout,
            mem_limit_mb=args.mem_limit,
            seed=args.seed,
            say=lambda text: print(text, file=sys.stderr, flush=True),
            compile_timeout_s=args.compile_timeout,
            reference_timeout_s=args.reference_timeout,
            search=args.search,
            search_budget=args.search_budget,
        )
    if summary["speedup"] is None:
        gain = f"unscheduled over the {args.timeout:g} s limit, so no speedup over it"
    else:
        gain = f"{summary['speedup']:.2f}x over unscheduled"
    print(
        f"best: {summary['best_source']}, {summary['best_ms']:.3f} ms, {gain}"
        + (f", {summary['over_heuristic']:.2f}x the heuristic" if summary["over_heuristic"] else "")
        + f" (verified); {summary['schedule']}"
    )
    print(f"wrote {args.out}: schedule.json, transform.mlir, transformed.mlir, summary.json")
    print(f"replay: {summary['replay']}")
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
    "threads",
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


def _positive(kind: type):
    """An argparse type: a finite number of `kind` above 0."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    return parse


POSITIVE_INT, POSITIVE_FLOAT = _positive(int), _positive(float)


def _add_measure_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads", type=POSITIVE_INT, default=1, help="threads for the scheduled kernel"
    )
    parser.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", "async", "openmp"],
        help="parallel runtime when --threads > 1 (auto: OpenMP if installed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a kernel's run (the verified call and the timed repeats) may take "
        "before its worker is killed",
    )
    parser.add_argument(
        "--mem-limit",
        type=POSITIVE_INT,
        default=DEFAULT_MEM_LIMIT_MB,
        help="worker address-space limit in MiB",
    )


def _add_phase_limits(parser: argparse.ArgumentParser) -> None:
    """The time limits of a measurement's phases other than the kernel's run (--timeout)."""
    parser.add_argument(
        "--compile-timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_COMPILE_TIMEOUT_S,
        help=f"seconds compiling a kernel may take ({DEFAULT_COMPILE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--reference-timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_REFERENCE_TIMEOUT_S,
        help="seconds computing a program's NumPy reference outputs may take, once per program "
        f"and seed: they are kept on disk ({DEFAULT_REFERENCE_TIMEOUT_S:g})",
    )


def _add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The seed and the measurement worker's limits, of commands that measure many kernels."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--timeout",
        type=POSITIVE_FLOAT,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a kernel's run (verified call and timed repeats) may take",
    )
    parser.add_argument(
        "--mem-limit", type=POSITIVE_INT, default=8192, help="worker address-space limit, MiB"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlirrl-jax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("measure", help="measure a program unscheduled and with a schedule")
    p.add_argument("program", help="suite:// URI, .mlir file")
    p.add_argument("--schedule", help="schedule JSON file (default: the heuristic schedule)")
    p.add_argument("--json", action="store_true", help="print both measurements as JSON")
    _add_measure_options(p)
    _add_phase_limits(p)
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser(
        "demo",
        help="the main job: adapt the shipped agent and surrogate to this machine, validate",
    )
    p.add_argument("programs", nargs="*", help="validation programs (default: a held-out six)")
    p.add_argument("--out", help="output folder (default: runs/demo-<time>)")
    p.add_argument("--rounds", type=int, help=f"re-grounding rounds ({DEMO_REGROUNDING['rounds']})")
    p.add_argument(
        "--real-budget",
        type=POSITIVE_INT,
        help=f"real measurements ({DEMO_REGROUNDING['real_budget']})",
    )
    p.add_argument(
        "--iterations", type=POSITIVE_INT, help="PPO iterations (default: 30 per round + 30)"
    )
    p.add_argument("--store", default="data/measurements.db", help="this machine's store")
    p.add_argument("--threads", type=_thread_counts, default=(1,), help="validation threads")
    p.add_argument("--budget", type=POSITIVE_INT, default=4, help="k of the validation (4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument(
        "--timeout", type=POSITIVE_FLOAT, default=DEFAULT_TIMEOUT_S, help="seconds per measurement"
    )
    p.add_argument(
        "--mem-limit", type=POSITIVE_INT, default=DEFAULT_MEM_LIMIT_MB, help="MiB per worker"
    )
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
    limit.add_argument(
        "--budget", type=POSITIVE_INT, help="stop at this many stored rows for the split"
    )
    limit.add_argument("--hours", type=POSITIVE_FLOAT, help="stop after this many hours")
    p.add_argument("--workers", type=POSITIVE_INT, default=2)
    p.add_argument(
        "--next-weight",
        type=float,
        default=0.25,
        help="probability weight of moving to the next op (1: uniform sampling)",
    )
    p.add_argument(
        "--per-visit",
        type=POSITIVE_INT,
        help="schedules of a program measured in a row, its reference outputs cached "
        "(default: CollectConfig.per_visit)",
    )
    p.add_argument(
        "--mix",
        help="where schedules come from, with shares: random (masked random episodes), "
        "heuristic (its schedule, then mutations around it), agent (a trained agent's "
        "samples), uncertain (of --candidates random episodes, the one --surrogate's ensemble "
        "is least sure of); default random:0.4,heuristic:0.4,agent:0.2",
    )
    p.add_argument("--agent", help="the agent run the agent source samples (default: shipped)")
    p.add_argument("--surrogate", help="the ensemble the uncertain source asks (members > 1)")
    p.add_argument(
        "--candidates",
        type=POSITIVE_INT,
        default=16,
        help="episodes the uncertain source draws per schedule it measures",
    )
    p.add_argument(
        "--measure-cpus",
        type=_cpu_list,
        help="cores the measured kernels run on, e.g. 0 or 0,1; the job itself may run "
        "elsewhere (taskset -c 1 mlirrl-jax collect --measure-cpus 0 ...)",
    )
    p.add_argument("--backend", default="local", choices=["local", "ray"])
    p.add_argument("--address", help="Ray cluster address, e.g. 127.0.0.1:6379")
    p.add_argument(
        "--max-programs", type=POSITIVE_INT, help="only the first N programs of the split"
    )
    p.add_argument(
        "--max-mflops", type=POSITIVE_FLOAT, help="only programs of at most this many MFLOP"
    )
    p.add_argument("--inject-faults", help=argparse.SUPPRESS)  # testing: crash,hang,wrong_output
    _add_measure_options(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("store", help="summarize, export or import a measurement store")
    p.add_argument("action", choices=["summary", "export", "import", "card"])
    p.add_argument("file", nargs="?", help="Parquet file (export/import), Markdown file (card)")
    p.add_argument(
        "--machine", help="machine id: of the card (default: this one), of an export (default: all)"
    )
    p.add_argument("--title", default="Measurement dataset")
    p.add_argument("--command", help="the command that collected the data, for the card")
    p.add_argument("--store", default="data/measurements.db")
    p.add_argument("--allow-other-machines", action="store_true")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("fit-cost-model", help="train the surrogate on a measurement store")
    p.add_argument("--store", default="data/measurements.db")
    p.add_argument("--out", default=f"runs/cost-model-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--machine", help="machine id whose measurements to use (default: this one)")
    p.add_argument(
        "--machines",
        help="fit one model on several machines' measurements: machine ids, comma-separated, or "
        "all (every machine of the store); each machine's programs are encoded with its profile",
    )
    p.add_argument(
        "--threads",
        type=_thread_counts,
        default=(1,),
        help="threads per kernel of the rows to fit on, e.g. 1 or 1,2 (default 1)",
    )
    # unset: the defaults of cost_model.train.TrainConfig and cost_model.model.ModelConfig
    p.add_argument("--epochs", type=POSITIVE_INT, help="passes over the training rows")
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
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("train", help="train the PPO agent on the surrogate (simulated reward)")
    p.add_argument("--out", required=True, help="the run folder, e.g. runs/NAME")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--minutes", type=POSITIVE_FLOAT, help="training time (default: the config's)"
    )
    budget.add_argument("--iterations", type=POSITIVE_INT, help="PPO iterations instead of a time")
    p.add_argument("--config", help="JSON file of AgentConfig fields (the rest: defaults)")
    p.add_argument("--surrogate", help="cost model folder, or 'analytic' (default: shipped)")
    p.add_argument(
        "--uncertainty-penalty",
        type=float,
        help="beta: the reward reads the surrogate's log time plus beta times its ensemble's "
        "spread (default 0: the mean; e.g. with --surrogate data/cost_model_multi)",
    )
    p.add_argument(
        "--train-threads",
        type=_thread_counts,
        help="threads per kernel the agent trains at, e.g. 1,2: every train program once per "
        "count, the count in the agent's observation (default: every count the surrogate was "
        "fitted on)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument(
        "--adopt",
        action="store_true",
        help="when done, make this run this machine's default agent (optimize, validate) at the "
        "thread count its surrogate was adapted to",
    )
    p.add_argument(
        "--init-agent",
        help="start from this run's policy (e.g. data/agent, the shipped agent; its config "
        "unless --config)",
    )
    ground = p.add_argument_group(
        "re-grounding",
        "measure the agent's top schedules on this machine and correct the "
        "surrogate between stretches of training (on with --rounds N > 0; a resumed run keeps "
        "its own settings)",
    )
    ground.add_argument("--rounds", type=int, help="re-grounding rounds (default 0: none)")
    ground.add_argument(
        "--real-budget",
        type=POSITIVE_INT,
        help="real measurements in all, a hard cap over every round, baselines, calibration and "
        "validation included; a plan over it is cut, validation first (2000)",
    )
    ground.add_argument("--round-programs", type=int, help="programs measured per round (16)")
    ground.add_argument("--top-k", type=int, help="schedules per program per round (8)")
    ground.add_argument(
        "--iterations-per-round",
        type=int,
        help="PPO iterations before each round and after the last, K (60): without --iterations "
        "or --minutes the run trains (rounds + 1) x K iterations",
    )
    ground.add_argument("--selection", choices=["gain", "uniform"], help="program choice (gain)")
    ground.add_argument(
        "--update",
        choices=["measured", "anchored", "residual"],
        help="what an update learns from (see RegroundConfig.update; default residual)",
    )
    ground.add_argument("--store", help="measurement store (data/measurements.db)")
    ground.add_argument(
        "--threads",
        type=POSITIVE_INT,
        help="threads per measured kernel: the rounds adapt the surrogate and agent to it (1)",
    )
    ground.add_argument(
        "--regrounding-config", help="JSON file of RegroundConfig fields (flags override it)"
    )
    p.set_defaults(func=cmd_train)

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
    p.add_argument("--suite", help="built-in suite (default dl-v0)")
    p.add_argument("--split", choices=["train", "surrogate-validation", "test"], help="(test)")
    p.add_argument("--kind", help="only programs of these op kinds (comma-separated)")
    p.add_argument("--programs", type=POSITIVE_INT, help="at most this many, evenly spaced")
    p.add_argument("--max-mflops", type=POSITIVE_FLOAT, help="only programs of at most this size")
    p.add_argument("--threads", type=_thread_counts, default=(1, 2), help="e.g. 1,2 (default)")
    p.add_argument(
        "--budget", type=POSITIVE_INT, default=8, help="k: real measurements of top-k (8)"
    )
    p.add_argument(
        "--random-factor", type=POSITIVE_INT, default=8, help="the larger random search: k x this"
    )
    p.add_argument(
        "--guided-samples",
        type=POSITIVE_INT,
        default=256,
        help="random schedules the surrogate ranks",
    )
    p.add_argument(
        "--evolutionary-budget",
        type=int,
        default=0,
        help="real measurements of the surrogate-guided evolutionary search per program and "
        "thread count (0: not run)",
    )
    p.add_argument("--xla", action=argparse.BooleanOptionalAction, default=True, help="XLA:CPU too")
    p.add_argument("--store", help="also store every measurement here")
    p.add_argument("--out", help="report folder (default: the run's, or runs/validate-<time>)")
    _add_worker_options(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("optimize", help="optimize your own MLIR kernel with the trained agent")
    p.add_argument("kernel", help="an .mlir file (named Linalg ops, linalg.generic, chains)")
    p.add_argument("--out", required=True, help="folder for the schedule, script, MLIR, summary")
    p.add_argument("--budget", type=POSITIVE_INT, default=8, help="the agent's top-k measured (8)")
    p.add_argument(
        "--threads", type=POSITIVE_INT, default=1, help="threads of the scheduled kernel"
    )
    p.add_argument("--run", help="the agent's run (default: adapted to this machine, else shipped)")
    p.add_argument(
        "--search",
        choices=["none", "evolutionary"],
        default="none",
        help="also run a search beside the agent: evolutionary (mutations of the best "
        "measured schedules, ranked by the agent's surrogate, fine-tuned between batches)",
    )
    p.add_argument(
        "--search-budget",
        type=POSITIVE_INT,
        default=64,
        help="real measurements of the search (64)",
    )
    _add_worker_options(p)
    _add_phase_limits(p)
    p.set_defaults(func=cmd_optimize)
    return parser


def _full_disk(exc: Exception, args: argparse.Namespace) -> str | None:
    """The one-line error for a full disk (or an exhausted quota), naming what was being
    written; None for any other error."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = os.strerror(exc.errno).lower()
        # a failed write of an open file names none: the command's output, else its store
        path = exc.filename or getattr(args, "out", None) or getattr(args, "store", None)
    elif isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
        why = "no space left on device"
        path = getattr(args, "store", None) or "data/measurements.db"  # train's default store
    else:
        return None
    again = "rerun"
    if args.command == "train" and has_checkpoint(args.out):
        again = "rerun with --resume"
    return f"error: {why} writing {path}: free space and {again}; nothing saved before was lost"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = command_line(argv)  # recorded in a run folder's lock
    try:
        with stop_on_ctrl_c():
            return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ProgramError, ScheduleError, KeyError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.OperationalError) as exc:
        line = _full_disk(exc, args)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
