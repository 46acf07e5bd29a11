"""The surrogate-guided evolutionary search (`mlirrl_jax.search`): it measures as it goes, its
surrogate fine-tuned between batches, starting from the trials it is given as known."""

from __future__ import annotations

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.strategies.base import Candidate, Method, Searcher, Searching, Trial, register


@register
class Evolutionary(Searcher):
    method, label, noun = Method.EVOLUTIONARY, "evolutionary", "evolutionary"
    baseline = True

    def search(self, ctx: Searching, measure, known: list[Trial]) -> list:
        from mlirrl_jax.search import EvolutionarySearch, EvolutionConfig

        if ctx.surrogate is None:
            raise ConfigError("the evolutionary search needs a cost model to start from")
        search = EvolutionarySearch(
            ctx.program,
            ctx.surrogate,
            ctx.threads,
            EvolutionConfig(budget=ctx.budget, seed=ctx.seed),
        )
        if ctx.say:
            ctx.say(f"  evolutionary search, {ctx.budget} measurements:")
        base = ctx.base
        result = search.run(
            measure,
            baseline=base if base is not None and base.ok and base.verified else None,
            progress=ctx.say,
            # known schedules are its first parents: never measured again nor credited to it
            known=[(t.schedule, t.measurement) for t in known],
        )
        return [
            (Candidate(t.schedule, t.predicted_speedup, t.origin), t.measurement)
            for t in result.trials
        ]
