"""The agent's strategies: its most likely schedule (greedy), its k proposals (top-k, by
default from what is known: `Agent.proposals`) and its own k best from scratch."""

from __future__ import annotations

from mlirrl_jax.strategies.base import Candidate, Method, Proposer, Proposing, register
from mlirrl_jax.strategies.shared import evaluator, own_topk


def _candidates(scored) -> list[Candidate]:
    return [Candidate(s.schedule, s.predicted_speedup, s.origin) for s in scored]


@register
class AgentGreedy(Proposer):
    method, label, noun = Method.AGENT_GREEDY, "agent greedy", "agent greedy"
    spends, single = False, True  # chosen with no measurement

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        agent = ctx.needs_agent(self.method)
        found = agent.scored_schedules(ctx.programs, n=1, evaluator=evaluator(ctx), seed=ctx.seed)
        return [_candidates(per[:1]) for per in found]


@register
class AgentTopK(Proposer):
    method, label, noun = Method.AGENT_TOPK, "agent top-k", "agent"

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        agent = ctx.needs_agent(self.method)
        found = agent.proposals(
            ctx.programs,
            ctx.budget,
            ctx.start,
            ctx.seed,
            evaluator=evaluator(ctx),
            own=own_topk(ctx),
        )
        return [_candidates(per) for per in found]


@register
class AgentScratchTopK(Proposer):
    """Beside a "known" start: what the agent proposes alone (with a "scratch" start it is the
    top-k itself, and validation does not measure it twice)."""

    method, label, noun = Method.AGENT_SCRATCH_TOPK, "agent top-k from scratch", "agent own"

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        ctx.needs_agent(self.method)
        return [_candidates(per) for per in own_topk(ctx)]
