"""The heuristic's schedule (`mlirrl_jax.heuristics`), with the surrogate's prediction for it
where an agent is given."""

from __future__ import annotations

import numpy as np

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.strategies.base import Candidate, Method, Proposer, Proposing, register
from mlirrl_jax.strategies.shared import evaluator


@register
class Heuristic(Proposer):
    method, label, noun = Method.HEURISTIC, "heuristic", "heuristic"
    spends, single = False, True  # it chooses with no measurement
    baseline = True

    def propose(self, ctx: Proposing) -> list[list[Candidate]]:
        predicted = [None] * len(ctx.programs)
        if ctx.agent is not None:
            ev = evaluator(ctx)
            scores = ev.heuristic(ev.prepare(ctx.agent.surrogate.params), ctx.threads)
            predicted = [float(x) for x in np.exp(scores)]
        return [
            [Candidate(heuristic_schedule(p, ctx.threads), guess, "heuristic")]
            for p, guess in zip(ctx.programs, predicted, strict=True)
        ]
