"""Every method's schedules of every program, chosen by the agent and the surrogate before any
measurement (`plan`), and which methods a validation measures (`validation_methods`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.strategies import Candidate, Method, Proposing, registry
from mlirrl_jax.validation.config import ValidationConfig

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """The candidates each proposing method measures on one program (chosen before any
    measurement), in `Method`'s order."""

    program: Program
    proposals: dict[Method, list[Candidate]]


def validation_methods(config: ValidationConfig) -> list[Method]:
    """The methods a validation with `config` measures, in `Method`'s order: the default ones
    and those it names (`also`); the agent's own top-k only beside a "known" start (else it is
    the top-k), the evolutionary search only with a budget."""
    chosen = []
    for method, strategy in registry().items():
        if not (strategy.default or method in config.also_methods):
            continue
        if method == Method.AGENT_SCRATCH_TOPK and config.agent_start == "scratch":
            continue
        if method == Method.EVOLUTIONARY and not config.evolutionary_budget:
            continue
        chosen.append(method)
    return chosen


def plan(
    agent: Agent, programs: list[Program], config: ValidationConfig, threads: int = 1
) -> list[Plan]:
    """Every proposing method's schedules of every program for kernels on `threads`, chosen by
    the agent and the surrogate alone (the count is in the agent's observation and the
    surrogate's features)."""
    ctx = Proposing(
        programs,
        threads,
        config.budget,
        config.seed,
        agent,
        config.agent_start,
        config.random_factor,
        config.guided_samples,
    )
    strategies = registry()
    chosen = {
        method: strategies[method].propose(ctx)
        for method in validation_methods(config)
        if not strategies[method].searches
    }
    return [
        Plan(program, {method: per[i] for method, per in chosen.items()})
        for i, program in enumerate(programs)
    ]
