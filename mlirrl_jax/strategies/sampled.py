"""Strategies over random schedules drawn as collection draws them (half uniform episodes, half
biased toward deeper schedules, interleaved): the first k, the first random_factor * k, and the
surrogate's top k of `guided_samples` draws."""

from __future__ import annotations

import numpy as np

from mlirrl_jax.strategies.base import Candidate, Method, Proposer, Proposing, register
from mlirrl_jax.strategies.shared import evaluator


def random_draws(ctx: Proposing) -> list[list[Candidate]]:
    """Per program, its distinct non-empty random schedules in draw order, each with the
    agent's surrogate's prediction (once per context)."""
    return ctx.once("random_draws", lambda: _draw(ctx))


def _draw(ctx: Proposing) -> list[list[Candidate]]:
    import jax

    from mlirrl_jax.agent.agent import _bucket
    from mlirrl_jax.env.replay import replay

    agent = ctx.needs_agent(Method.RANDOM_K)
    ev = evaluator(ctx)
    reward_params = ev.prepare(agent.surrogate.params)
    programs = ctx.programs
    wanted = max(ctx.budget * ctx.random_factor, ctx.guided_samples)
    found: list[dict] = [{} for _ in programs]
    for attempt in range(4):  # repeats: draw more until each program has `wanted` or gives up
        short = [i for i in range(len(programs)) if len(found[i]) < wanted]
        if not short:
            break
        per = wanted * (1 + attempt)
        chosen = np.repeat(np.asarray(short), per)
        padded = np.resize(chosen, _bucket(len(chosen))).astype(np.int32)
        runs = []
        for j, weight in enumerate((1.0, 0.25)):
            key = jax.random.PRNGKey(ctx.seed * 7919 + attempt * 31 + j)
            runs.append(ev.random_episodes(reward_params, padded, key, weight))
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
                    found[row].setdefault(
                        schedule.hash, Candidate(schedule, float(speedups[j][e]), "random")
                    )
    return [list(per.values()) for per in found]


@register
class RandomK(Proposer):
    method, label, noun = Method.RANDOM_K, "random k", "random"

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        return [per[: ctx.budget] for per in random_draws(ctx)]


@register
class RandomWide(Proposer):
    method, label, noun = Method.RANDOM_8K, "random 8k", "random"
    curve, baseline = True, True

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        return [per[: ctx.budget * ctx.random_factor] for per in random_draws(ctx)]


@register
class SurrogateTopK(Proposer):
    method, label, noun = Method.SURROGATE_TOPK, "surrogate top-k", "surrogate"

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        return [sorted(per, key=lambda c: -c.predicted)[: ctx.budget] for per in random_draws(ctx)]
