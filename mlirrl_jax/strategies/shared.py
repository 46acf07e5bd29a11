"""Work several strategies share on one batch of programs, done once per `Proposing`: the
agent's evaluator and its own scored episodes."""

from __future__ import annotations

from mlirrl_jax.strategies.base import Method, Proposing


def evaluator(ctx: Proposing):
    """The agent's episode runners on the batch at the context's thread count."""
    agent = ctx.needs_agent(Method.AGENT_TOPK)
    return ctx.once("evaluator", lambda: agent.evaluator(ctx.programs, ctx.threads))


def own_topk(ctx: Proposing) -> list:
    """Per program, the agent's own k best distinct schedules (`Agent.scored_schedules`)."""
    return ctx.once(
        "own_topk",
        lambda: ctx.agent.scored_schedules(
            ctx.programs, n=ctx.budget, evaluator=evaluator(ctx), seed=ctx.seed
        ),
    )
