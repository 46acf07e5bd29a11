"""A small strategy, and the example of adding one: the surrogate's k best refinements of the
heuristic's schedule (`Agent.refinements`: one change each, the policy's choices where the
change leaves them open), without the agent's own episodes. Beside `agent_topk` it tells how
much of a "known" start's gain the refinements alone bring. Not measured by default:
`validate --also refined_topk`."""

from __future__ import annotations

from mlirrl_jax.agent.agent import SAMPLES_PER_SCHEDULE
from mlirrl_jax.strategies.base import Candidate, Method, Proposer, Proposing, register
from mlirrl_jax.strategies.shared import evaluator


@register
class RefinedTopK(Proposer):
    method, label, noun = Method.REFINED_TOPK, "heuristic refined top-k", "refined"
    default = False

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        agent = ctx.needs_agent(self.method)
        ev = evaluator(ctx)
        rows = range(len(ctx.programs))
        found = agent.refinements(ev, rows, SAMPLES_PER_SCHEDULE * ctx.budget, ctx.seed)
        return [
            [
                Candidate(s.schedule, s.predicted_speedup, "refined")
                for s in found[r]
                if s.origin != "heuristic"
            ][: ctx.budget]
            for r in rows
        ]
