"""Every method's schedules of every program, chosen by the agent and the surrogate before any
measurement (`plan`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import jax
import numpy as np

from mlirrl_jax.agent.agent import Agent, _bucket
from mlirrl_jax.env.replay import replay
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.validation.config import ValidationConfig

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """The schedules each method measures on one program (chosen before any measurement)."""

    program: Program
    greedy: tuple[Schedule, float]
    agent_topk: list[tuple[Schedule, float]]
    agent_scratch: list[tuple[Schedule, float]]  # the agent's own top-k (= agent_topk: scratch)
    random: list[tuple[Schedule, float]]  # in draw order: random_k is the first k
    guided: list[tuple[Schedule, float]]
    heuristic_predicted: float
    predicted: dict = field(default_factory=dict)  # schedule hash -> predicted speedup


def plan(
    agent: Agent, programs: list[Program], config: ValidationConfig, threads: int = 1
) -> list[Plan]:
    """Every method's schedules of every program for kernels on `threads`, chosen by the agent
    and the surrogate alone (the count is in the agent's observation and the surrogate's
    features)."""
    k, random_n = config.budget, config.budget * config.random_factor
    evaluator = agent.evaluator(programs, threads)
    greedy = agent.scored_schedules(programs, n=1, evaluator=evaluator, seed=config.seed)
    scratch = agent.scored_schedules(programs, n=k, evaluator=evaluator, seed=config.seed)
    topk = agent.proposals(
        programs, k, config.agent_start, config.seed, evaluator=evaluator, own=scratch
    )
    reward_params = evaluator.prepare(agent.surrogate.params)
    heuristic = np.exp(evaluator.heuristic(reward_params, threads))
    draws = _random_draws(agent, evaluator, reward_params, programs, config)
    plans = []
    for i, program in enumerate(programs):
        found = draws[i]
        distinct = list(found.items())  # draw order
        ranked = sorted(distinct, key=lambda item: -item[1][1])
        p = Plan(
            program=program,
            greedy=(greedy[i][0].schedule, greedy[i][0].predicted_speedup),
            agent_topk=[(s.schedule, s.predicted_speedup) for s in topk[i]],
            agent_scratch=[(s.schedule, s.predicted_speedup) for s in scratch[i]],
            random=[item[1] for item in distinct[:random_n]],
            guided=[item[1] for item in ranked[:k]],
            heuristic_predicted=float(heuristic[i]),
        )
        for schedule, predicted in [p.greedy, *p.agent_scratch, *p.agent_topk, *found.values()]:
            p.predicted[schedule.hash] = predicted
        plans.append(p)
    return plans


def _random_draws(agent, evaluator, reward_params, programs, config) -> list[dict]:
    """Per program, its distinct non-empty random schedules (hash -> (schedule, predicted
    speedup)) in draw order, half uniform and half deeper-biased episodes interleaved."""
    wanted = max(config.budget * config.random_factor, config.guided_samples)
    found: list[dict] = [{} for _ in programs]
    rows = np.arange(len(programs))
    for attempt in range(4):  # repeats: draw more until each program has `wanted` or gives up
        short = [i for i in rows if len(found[i]) < wanted]
        if not short:
            break
        per = wanted * (1 + attempt)
        chosen = np.repeat(np.asarray(short), per)
        padded = np.resize(chosen, _bucket(len(chosen))).astype(np.int32)
        runs = []
        for j, weight in enumerate((1.0, 0.25)):
            key = jax.random.PRNGKey(config.seed * 7919 + attempt * 31 + j)
            runs.append(evaluator.random_episodes(reward_params, padded, key, weight))
        actions = [np.asarray(r.actions) for r in runs]
        steps = [np.asarray(r.steps) for r in runs]
        speedups = [np.exp(np.asarray(r.log_speedup)) for r in runs]
        for e in range(len(chosen)):  # interleaved: uniform, deep, uniform, ...
            for j in range(2):
                row = int(padded[e])
                if len(found[row]) >= wanted:
                    continue
                schedule, _ = replay(programs[row], actions[j][e, : steps[j][e]])
                if schedule.ops:
                    found[row].setdefault(schedule.hash, (schedule, float(speedups[j][e])))
    return found
