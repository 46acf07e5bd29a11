"""`mlirrl-jax demo`: the main job (`mlirrl_jax.demo`)."""

from __future__ import annotations

import time
from pathlib import Path

from mlirrl_jax.cli.options import (
    POSITIVE_FLOAT,
    POSITIVE_INT,
    add_field_flags,
    add_worker_options,
    given,
    thread_counts,
    worker_settings,
)
from mlirrl_jax.demo import DemoConfig, demo_programs, methods_without_result, run_demo
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.runfolder import has_checkpoint, run_folder
from mlirrl_jax.shipped import default_store

FIELDS = ("minutes", "rounds", "real_budget", "iterations")


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: adapt the shipped agent and surrogate to this machine, validate",
    )
    p.add_argument("programs", nargs="*", help="validation programs (default: a held-out six)")
    p.add_argument("--out", help="output folder (default: runs/demo-<time>)")
    add_field_flags(
        p,
        "mlirrl_jax.demo:DemoConfig",
        FIELDS,
        types={"minutes": POSITIVE_FLOAT, "real_budget": POSITIVE_INT, "iterations": POSITIVE_INT},
    )
    p.add_argument("--store", default=default_store(), help="this machine's measurement store")
    p.add_argument("--threads", type=thread_counts, default=(1,), help="validation threads (1)")
    p.add_argument("--budget", type=POSITIVE_INT, default=4, help="k of the validation (4)")
    add_worker_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """The demo's folder and the agent's run in it are held as `train` holds a run's; the
    validation programs are read before minutes of adapting."""
    out_dir = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    agent_run = out_dir / "agent"
    config = DemoConfig(
        store=args.store,
        threads=args.threads,
        budget=args.budget,
        **worker_settings(args),
        **given(args, FIELDS),
    )
    with (
        run_folder(out_dir, keep=lambda _: has_checkpoint(agent_run), command=args.command_line),
        run_folder(agent_run, keep=has_checkpoint, command=args.command_line),
    ):
        if (agent_run / "checkpoints").exists():
            raise ConfigError(f"{agent_run} already holds an agent run: choose another --out")
        programs = demo_programs(args.programs)
        rows, summary = run_demo(out_dir, programs, config)
    print((out_dir / "validation.md").read_text())
    print(
        f"Report: {out_dir}/validation.md, validation.json, validation_*.png; re-grounding: "
        f"{agent_run}/regrounding/rounds.md, onpolicy_error.png, predicted_vs_real.png"
    )
    return 0 if summary["threads"] and not methods_without_result(rows) else 1
