"""`mlirrl-jax fit-cost-model`: fit the surrogate on a measurement store's rows of one machine
or several (`mlirrl_jax.surrogate.report.fit_and_report`)."""

from __future__ import annotations

import time
from pathlib import Path

from mlirrl_jax.cli.options import add_field_flags, given, thread_counts
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.shipped import default_store

TRAIN_FIELDS = (
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
)
MODEL_FIELDS = ("op_width", "heads", "members")


def register(sub) -> None:
    p = sub.add_parser("fit-cost-model", help="train the surrogate on a measurement store")
    p.add_argument(
        "--store", default=default_store(), help=f"the measurement store ({default_store()})"
    )
    p.add_argument("--out", default=f"runs/cost-model-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--machine", help="machine id whose measurements to use (default: this one)")
    p.add_argument(
        "--machines",
        help="fit one model on several machines' measurements: machine ids, comma-separated, or "
        "all (every machine of the store); each machine's programs are encoded with its profile",
    )
    p.add_argument(
        "--threads",
        type=thread_counts,
        default=(1,),
        help="threads per kernel of the rows to fit on, e.g. 1 or 1,2 (default 1)",
    )
    # unset: the defaults of mlirrl_jax.surrogate.train.TrainConfig and mlirrl_jax.surrogate.model.ModelConfig
    add_field_flags(
        p,
        "mlirrl_jax.surrogate.config:TrainConfig",
        TRAIN_FIELDS,
        types={"max_steps": int, "distill_max_steps": int},
    )
    add_field_flags(p, "mlirrl_jax.surrogate.config:ModelConfig", MODEL_FIELDS)
    p.add_argument("--seed", type=int, default=0, help="seed of the fit")
    p.set_defaults(func=run)


def run(args) -> int:
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.surrogate.config import ModelConfig, TrainConfig
    from mlirrl_jax.surrogate.report import fit_and_report, format_metrics

    config = TrainConfig(
        seed=args.seed,
        **given(args, TRAIN_FIELDS),
        model=ModelConfig(seed=args.seed, **given(args, MODEL_FIELDS)),
    )
    if args.machines is not None:  # several machines: asked for by name, or all
        from mlirrl_jax.store import MeasurementStore
        from mlirrl_jax.surrogate.dataset import resolve_machines

        if args.machine:
            raise ConfigError("--machine and --machines: give one of them")
        with MeasurementStore(args.store, create=False) as store:
            machine = resolve_machines(store, args.machines)
    else:
        machine = args.machine or machine_fingerprint()["machine_id"]
    threads = list(args.threads) if len(args.threads) > 1 else args.threads[0]
    result = fit_and_report(Path(args.store), Path(args.out), machine, config, threads=threads)
    print(format_metrics(result))
    print(
        f"trained in {result.fit_seconds:.0f} s on {result.train_rows} rows; held out "
        f"{result.held_out_programs} programs ({result.held_out_rows} rows); "
        f"model, metrics.json and predicted_vs_measured.png in {Path(args.out).resolve()}"
    )
    return 0
