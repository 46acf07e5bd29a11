"""`mlirrl-jax train --out RUN`: train the PPO agent on the surrogate, optionally re-grounding
the surrogate on this machine between stretches (`mlirrl_jax.agent.run.run_training`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mlirrl_jax.cli.options import POSITIVE_FLOAT, POSITIVE_INT, thread_counts
from mlirrl_jax.cli.regrounding import add_regrounding_options, regrounding_from_flags
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.runfolder import check_inputs, has_checkpoint, run_folder


def register(sub) -> None:
    p = sub.add_parser("train", help="train the PPO agent on the surrogate (simulated reward)")
    p.add_argument("--out", required=True, help="the run folder, e.g. runs/NAME")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--minutes", type=POSITIVE_FLOAT, help="training time (default: the config's)"
    )
    budget.add_argument("--iterations", type=POSITIVE_INT, help="PPO iterations instead of a time")
    # flags of this command alone (the shared groups come from `options`)
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
        type=thread_counts,
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
    add_regrounding_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Holding the run folder: before JAX starts, the inputs are checked and a second process
    on the folder is refused; a start that fails before the first checkpoint leaves nothing."""
    check_inputs(files=(args.config, args.regrounding_config), runs=(args.init_agent,))
    with run_folder(args.out, keep=has_checkpoint, command=args.command_line):
        if args.resume and not has_checkpoint(args.out):  # said before JAX starts
            raise ConfigError(f"{args.out}: nothing to resume (no checkpoint in it): drop --resume")
        return _train(args)


def _agent_config(args):
    """The run's AgentConfig: --config, else --init-agent's, with the flags that change it."""
    from mlirrl_jax.agent.config import AgentConfig

    config = (
        AgentConfig.from_json(json.loads(Path(args.config).read_text())) if args.config else None
    )
    if args.init_agent and config is None and not args.resume:
        from mlirrl_jax.agent.checkpoint import load_meta

        config = AgentConfig.from_json(load_meta(Path(args.init_agent))["config"])
    changes = {
        "surrogate": ("surrogate", "a resumed run keeps its surrogate: drop --surrogate"),
        "uncertainty_penalty": (
            "uncertainty_penalty",
            "a resumed run keeps its reward: drop --uncertainty-penalty",
        ),
        "train_threads": (
            "threads",
            "a resumed run keeps its thread counts: drop --train-threads",
        ),
    }
    for flag, (field, refusal) in changes.items():
        if getattr(args, flag) is not None:
            if args.resume:
                raise ConfigError(refusal)
            config = replace(config or AgentConfig(), **{field: getattr(args, flag)})
    return config


def _train(args) -> int:
    from mlirrl_jax.host_devices import use_compilation_cache, use_host_devices

    use_host_devices()  # every core an XLA device: the environments are split across them
    use_compilation_cache()
    from mlirrl_jax.agent.run import run_training

    out = Path(args.out)
    budget = {}
    if args.minutes is not None:
        budget = {"minutes": args.minutes, "iterations": 0}
    elif args.iterations is not None:
        budget = {"iterations": args.iterations}
    config = _agent_config(args)
    regrounding = regrounding_from_flags(args)
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
        from mlirrl_jax.adopted import adopt_agent_run
        from mlirrl_jax.agent.agent import Agent

        threads = Agent.load(out).surrogate.threads
        pointer = adopt_agent_run(out, threads)
        print(f"this machine's agent at {threads} thread(s) is now this run's ({pointer})")
    return 0
