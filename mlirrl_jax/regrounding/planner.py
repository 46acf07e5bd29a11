"""A round's plan (`RoundPlanner`): which schedules of which programs it measures, within what
is left of the run's real budget, and the program pools it draws from (`Pools`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.env.replay import state_of_schedule
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.regrounding.config import RegroundConfig, uncertain_gain_order
from mlirrl_jax.regrounding.measure import RoundMeasurer
from mlirrl_jax.regrounding.plan import Planned, within_budget
from mlirrl_jax.sampler import EpisodeSampler, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.util.stats import pick_evenly


@dataclass
class Pools:
    """The programs a run's rounds draw from, each at most `max_mflops`: the training pool
    (programs to learn from), the tracked ones (measured every round), the held-out test
    programs and the surrogate-validation ones."""

    pool: list[Program]
    track: list[Program]
    heldout: list[Program]
    validation: list[Program]
    by_name: dict[str, Program] = field(default_factory=dict)

    @classmethod
    def of(cls, config: RegroundConfig, train: list, heldout: list, validation: list) -> Pools:
        small = lambda ps: [p for p in ps if p.flops <= config.max_mflops * 1e6]  # noqa: E731
        pool = small(train)
        if not pool:
            raise ConfigError(f"no training program of at most {config.max_mflops} MFLOP")
        pools = cls(
            pool,
            pick_evenly(pool, config.track_programs),
            pick_evenly(small(heldout), config.heldout_programs),
            pick_evenly(small(validation), config.validation_programs),
        )
        pools.by_name = {p.name: p for p in [*pools.pool, *pools.heldout, *pools.validation]}
        return pools

    @property
    def programs(self) -> list[Program]:
        """Every program of the pools, once (the evaluator's table)."""
        return list(self.by_name.values())


class RoundPlanner:
    """Chooses each round's measurements: calibration and validation schedules in round 1,
    the agent's top-k on the programs chosen to learn from, the tracked and held-out programs'
    greedy schedules, the baselines; cut to the round's allowance (`within_budget`)."""

    def __init__(self, config: RegroundConfig, pools: Pools, measurer: RoundMeasurer):
        self.config = config
        self.pools = pools
        self.measurer = measurer
        self._evaluator = None  # one table and compiled episodes for every round

    def allowance(self, round_: int) -> int:
        """The new measurements round `round_` may plan: what is left of the budget, less a
        reserve for each later round (its core: the learned and tracked schedules with their
        baselines, or an even share of what is left)."""
        c = self.config
        left = max(0, c.real_budget - self.measurer.spent())
        later = c.rounds - round_
        core = c.round_programs * (c.top_k + 1) + c.track_programs
        return left - min(later * core, left * later // (later + 1))

    def plan(self, round_: int, agent: Agent, chosen_before: set[str]) -> tuple[list, dict]:
        """The round's measurements within its allowance, and what the cut left out.
        `chosen_before`: the names of the programs earlier rounds learned from."""
        c, pools = self.config, self.pools
        rng = np.random.default_rng([c.seed, round_])
        if self._evaluator is None:
            self._evaluator = agent.evaluator(pools.programs, c.threads)
        evaluator, row_of = self._evaluator, {p.name: i for i, p in enumerate(pools.programs)}

        def best(programs: list[Program], n: int = 1):
            rows = [row_of[p.name] for p in programs]
            return zip(
                programs, agent.scored_schedules([], n, evaluator=evaluator, rows=rows, seed=round_)
            )

        measured = self._has_rows()
        planned: list[Planned] = []
        if round_ == 1 and not measured & {p.hash for p in pools.pool}:
            calibration = pick_evenly(pools.pool[::-1], c.calibration_programs)
            planned += [Planned(p, s[0].schedule, "calibration") for p, s in best(calibration)]
            planned += self._random_schedules(calibration, c.calibration_k, "calibration")
        if round_ == 1:
            planned += self._random_schedules(pools.validation, c.validation_k, "validation")
        candidates = [p for p in pools.pool if p.name not in chosen_before]
        if c.selection == "uniform":
            picks = [candidates[i] for i in rng.permutation(len(candidates))[: c.round_programs]]
        else:
            reward = evaluator.prepare(agent.surrogate.params)
            greedy = list(best(candidates))
            rows = [row_of[p.name] for p in candidates]
            gain = (
                np.log([s[0].predicted_speedup for _, s in greedy])
                - evaluator.heuristic(reward, c.threads)[rows]
            )
            order = np.argsort(-gain, kind="stable")
            if c.selection == "uncertain_gain":
                states = [
                    state_of_schedule(p, s[0].schedule).to_env_state(row)
                    for (p, s), row in zip(greedy, rows, strict=True)
                ]
                order = uncertain_gain_order(gain, evaluator.spread_states(reward, states))
            picks = [candidates[i] for i in order[: c.round_programs]]
        for program, scored in best(picks, c.top_k):
            planned += [Planned(program, s.schedule, "learn", s.predicted_speedup) for s in scored]
        for program, scored in best(pools.track):
            planned.append(
                Planned(program, scored[0].schedule, "track", scored[0].predicted_speedup)
            )
        if pools.heldout and (round_ % c.heldout_every == 0 or round_ in (1, c.rounds)):
            for program, scored in best(pools.heldout):
                planned.append(
                    Planned(program, scored[0].schedule, "heldout", scored[0].predicted_speedup)
                )
                planned.append(
                    Planned(program, heuristic_schedule(program, c.threads), "heuristic")
                )
        for program in {p.program.name: p.program for p in planned}.values():
            planned.append(Planned(program, Schedule(), "baseline"))
        with MeasurementStore(c.store) as store:
            stored = {p.key for p in planned if self.measurer.row(store, *p.key) is not None}
        return within_budget(planned, stored, self.allowance(round_))

    def _has_rows(self) -> set[str]:
        """Hashes of the pools' programs whose baseline this machine has measured."""
        with MeasurementStore(self.config.store) as store:
            return {
                p.hash
                for p in self.pools.programs
                if self.measurer.row(store, p.hash, Schedule().hash) is not None
            }

    def _random_schedules(self, programs: list[Program], k: int, role: str) -> list[Planned]:
        """`k` distinct random schedules of each program, drawn as collection draws them
        (half uniform, half biased toward deeper schedules): the spread of schedules the
        surrogate's own validation scores it on, never the agent's."""
        if not programs or k < 1:
            return []
        uniform = EpisodeSampler(programs, random_policy(1.0))
        samplers = [uniform, EpisodeSampler(programs, random_policy(0.25), uniform.table)]
        planned, salt = [], sum(map(ord, role))
        for i, program in enumerate(programs):
            found: dict[str, Schedule] = {}
            for draw in range(8 * k):
                if len(found) == k:
                    break
                key = jax.random.PRNGKey(
                    self.config.seed * 1_000_003 + salt * 7919 + i * 1009 + draw
                )
                schedule, _ = samplers[draw % 2].schedule(i, key)
                if schedule.ops:  # the empty schedule is the baseline, measured anyway
                    found.setdefault(schedule.hash, schedule)
            planned += [Planned(program, s, role) for s in found.values()]
        return planned
