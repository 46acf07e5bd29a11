"""`mlirrl-jax collect`: measure sampled schedules of a suite's programs into the store
(`mlirrl_jax.collect.CollectionJob`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlirrl_jax.cli.options import (
    POSITIVE_FLOAT,
    POSITIVE_INT,
    add_field_flags,
    add_worker_options,
    cpu_list,
    given,
    module_constant,
    worker_settings,
)
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.shipped import default_store

FIELDS = (
    "suite",
    "workers",
    "gate",
    "threads",
    "next_weight",
    "per_visit",
    "candidates",
    "backend",
    "address",
    "max_programs",
    "max_mflops",
)


def register(sub) -> None:
    p = sub.add_parser("collect", help="measure sampled schedules into the measurement store")
    p.add_argument(
        "--store", default=default_store(), help=f"the measurement store ({default_store()})"
    )
    p.add_argument(
        "--split",
        default="train",
        choices=["train", "test"],
        help="the suite's own split: train (its non-test programs: the named train and "
        "surrogate-validation splits, mlirrl_jax.splits) or test",
    )
    limit = p.add_mutually_exclusive_group()
    limit.add_argument(
        "--rows", type=POSITIVE_INT, help="stop when the store holds this many rows for the split"
    )
    limit.add_argument("--hours", type=POSITIVE_FLOAT, help="stop after this many hours")
    limit.add_argument("--budget", type=int, help=argparse.SUPPRESS)  # renamed --rows
    add_field_flags(
        p,
        "mlirrl_jax.collect.config:CollectConfig",
        FIELDS,
        types={
            "workers": POSITIVE_INT,
            "threads": POSITIVE_INT,
            "per_visit": POSITIVE_INT,
            "candidates": POSITIVE_INT,
            "max_programs": POSITIVE_INT,
            "max_mflops": POSITIVE_FLOAT,
        },
        choices={"backend": module_constant("mlirrl_jax.collect.config:BACKENDS")},
    )
    p.add_argument(
        "--mix",
        help="where schedules come from, with shares: random (masked random episodes), "
        "heuristic (its schedule, then mutations around it), agent (a trained agent's "
        "samples), uncertain (of --candidates random episodes, the one --surrogate's ensemble "
        "is least sure of); default random:0.4,heuristic:0.4,agent:0.2",
    )
    # flags of this command alone (the shared groups come from `options`)
    p.add_argument("--agent", help="the agent run the agent source samples (default: shipped)")
    p.add_argument("--surrogate", help="the ensemble the uncertain source asks (members > 1)")
    p.add_argument(
        "--measure-cpus",
        type=cpu_list,
        help="cores the measured kernels run on, e.g. 0 or 0,1; the job itself may run "
        "elsewhere (taskset -c 1 mlirrl-jax collect --measure-cpus 0 ...)",
    )
    p.add_argument(
        "--timing",
        choices=["adaptive", "full"],
        default="adaptive",
        help="adaptive: a kernel of 50 ms or more stops after 2 calls, its first one "
        "included, if they agree within 2%% (IQR / median); full: every kernel makes a warm-up "
        "call, then at least 5 calls and 0.1 s (default adaptive)",
    )
    p.add_argument("--inject-faults", help=argparse.SUPPRESS)  # testing: crash,hang,wrong_output
    add_worker_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.budget is not None:
        raise ConfigError(
            "collect --budget is now --rows (stop when the store holds this many rows for the "
            "split); --budget means the agent's real measurements in every other command"
        )
    if args.rows is None and args.hours is None:
        raise ConfigError("collect needs a limit: --rows N or --hours H")
    from mlirrl_jax.collect import CollectConfig, CollectionJob, parse_mix
    from mlirrl_jax.host_devices import use_compilation_cache
    from mlirrl_jax.measure.timing import ADAPTIVE, TimingMethod

    use_compilation_cache()  # a resumed job loads its samplers' compiled steps

    config = CollectConfig(
        store=Path(args.store),
        split=args.split,
        budget=args.rows,
        hours=args.hours,
        **worker_settings(args),
        **given(args, FIELDS),
        **({"mix": parse_mix(args.mix)} if args.mix is not None else {}),
        agent=Path(args.agent) if args.agent else None,
        surrogate=Path(args.surrogate) if args.surrogate else None,
        measure_cpus=args.measure_cpus or (),
        method=ADAPTIVE if args.timing == "adaptive" else TimingMethod(),
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
