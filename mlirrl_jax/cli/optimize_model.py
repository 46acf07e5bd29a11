"""`mlirrl-jax optimize-model DIR --out DIR`: every layer of an imported model optimized, the
model's time composed and compared with PyTorch and XLA (`mlirrl_jax.models.optimize`)."""

from __future__ import annotations

import logging
from pathlib import Path

# the option groups every measuring command shares
from mlirrl_jax.cli.options import (
    POSITIVE_INT,
    add_worker_options,
    given,
    refuse_without,
    thread_counts,
    worker_settings,
)
from mlirrl_jax.runfolder import run_folder

log = logging.getLogger("mlirrl_jax.models")


def register(sub) -> None:
    p = sub.add_parser(
        "optimize-model",
        help="optimize every layer of an imported model and compare the whole model with "
        "PyTorch and XLA",
    )
    p.add_argument("model", help="a folder written by import-model")
    p.add_argument(
        "--out",
        required=True,
        help="folder for the per-layer rows, table and plot (a rerun resumes the same import)",
    )
    p.add_argument("--budget", type=POSITIVE_INT, default=4, help="agent schedules per layer (4)")
    p.add_argument("--threads", type=thread_counts, default=(1,), help="e.g. 1,2 (default 1)")
    p.add_argument("--run", help="the agent's run (default: adapted to this machine, else shipped)")
    p.add_argument("--no-xla", action="store_true", help="skip XLA:CPU on the layers")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch eager and torch.compile")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile only")
    p.add_argument(
        "--search-top",
        type=int,
        default=0,
        help="also run the evolutionary search on this many layers that take most of the "
        "model's time (0: none)",
    )
    p.add_argument(
        "--search-budget", type=POSITIVE_INT, help="measurements per searched layer (32)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="optimize an import whose check against the model failed or could not run "
        "(refused otherwise); every report then carries a warning",
    )
    add_worker_options(p)
    p.set_defaults(func=run_optimize)


def run_optimize(args) -> int:
    refuse_without(args, "--search-budget", "--search-top N", args.search_top > 0)
    from mlirrl_jax.models.optimize import optimize_model

    # summary.json is written last; layers.jsonl holds what a rerun resumes from
    keep = lambda out: (out / "layers.jsonl").is_file()  # noqa: E731
    with run_folder(args.out, keep, args.command_line):
        # each flag to the parameter of its name
        summary = optimize_model(
            args.model,
            args.out,
            budget=args.budget,
            threads=args.threads,
            run=args.run,
            **worker_settings(args),
            xla=not args.no_xla,
            torch_baselines=not args.no_torch,
            torch_compile=not args.no_compile,
            search_top=args.search_top,
            **given(args, ("search_budget",)),
            force=args.force,
            say=log.info,
        )
    print(args.out.rstrip("/") + "/table.md:")
    text = (Path(args.out) / "table.md").read_text()
    print(text.split("\n## Layers")[0].rstrip())
    print(
        f"machine {summary.machine_id}; wrote {args.out}: table.md, time_by_layer.png, summary.json"
    )
    return 0
