"""A trained agent: `Agent.load(run_dir)`, then `agent.schedules(programs, n, greedy)`.

Schedules come from whole episodes in the jitted environment, turned into `Schedule`s by the
Python `replay` of their applied actions, so what the agent returns is exactly what the real
pipeline compiles. With `n > 1` the agent also samples episodes and returns the n best
distinct schedules (the greedy one among them), ranked by the surrogate's prediction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax import integrity
from mlirrl_jax.agent import checkpoint
from mlirrl_jax.agent.config import STARTS, AgentConfig
from mlirrl_jax.agent.evaluate import Evaluator
from mlirrl_jax.agent.networks import abstract
from mlirrl_jax.agent.surrogate import Surrogate, load_surrogate
from mlirrl_jax.agent.train import make_env
from mlirrl_jax.env.replay import replay
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.schedule import Schedule

SAMPLES_PER_SCHEDULE = 8  # sampled episodes per schedule asked for, before removing repeats
# the policy's own distributions first, then flatter ones while a program lacks distinct ones
SAMPLING_TEMPERATURES = (1.0, 2.0, 4.0)
MIN_ROWS = 64


def _bucket(rows: int) -> int:
    """Rows padded to a power of two of at least `MIN_ROWS`: a few compiled episode runners
    serve any number of programs."""
    return max(MIN_ROWS, 1 << int(np.ceil(np.log2(max(rows, 1)))))


@dataclass(frozen=True)
class Scored:
    """A schedule with the surrogate's predicted speedup over the unscheduled program."""

    schedule: Schedule
    predicted_speedup: float
    origin: str = (
        "agent"  # "agent" (its own episode), "heuristic" or "refined" (of the heuristic's)
    )


class Agent:
    """A policy network with the reward model it was trained against."""

    def __init__(self, config: AgentConfig, params, surrogate: Surrogate):
        self.config = config
        self.params = params
        self.surrogate = surrogate
        self.graphdef, _ = abstract(config.network)
        self.env = make_env(config, surrogate.model)

    @classmethod
    def load(cls, run_dir: str | os.PathLike, surrogate: Surrogate | None = None) -> Agent:
        """The agent of a training run's newest checkpoint with the surrogate of its config
        (or `surrogate`); refuses a checkpoint of another observation or action-space
        version, and a surrogate other than the one it was trained against. Checks the run's
        files against its manifest (a finished run's, the shipped agent's) first: a damaged
        file is one line naming it, before any slow work."""
        run_dir = Path(run_dir)
        integrity.verify(run_dir, checkpoint.REDO)
        meta = checkpoint.load_meta(run_dir)
        config = AgentConfig.from_json(meta["config"])
        if surrogate is None:
            # a re-grounded run trained last against its own surrogate, saved in the run
            recorded = Path(meta.get("surrogate", {}).get("path", ""))
            own = recorded.is_dir() and Path(run_dir).resolve() in recorded.resolve().parents
            surrogate = load_surrogate(str(recorded) if own else config.surrogate)
        trained_against = meta.get("surrogate", {}).get("params_sha256")
        if trained_against != surrogate.identity.get("params_sha256"):
            raise checkpoint.CheckpointError(
                f"{run_dir} was trained against the surrogate {meta.get('surrogate')}; the one "
                f"loaded is {surrogate.identity}: pass the surrogate it was trained against"
            )
        params = checkpoint.restore_params(run_dir, abstract(config.network)[1], meta)
        return cls(config, params, surrogate)

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """The thread counts it was trained at (each one in its observation)."""
        return tuple(self.config.threads) or self.surrogate.thread_counts

    def evaluator(self, programs: list[Program], threads: int | None = None) -> Evaluator:
        """Episode runners and scores on these programs (reusable across calls), on this
        machine at `threads` per kernel (default: the surrogate's count). The count is in the
        observation: an agent trained at it acts for it."""
        threads = self.surrogate.threads if threads is None else int(threads)
        if threads < 1:
            raise ConfigError(f"threads must be at least 1, got {threads}")
        table = encode_programs(programs, threads=threads)
        return Evaluator(self.env, programs, self.graphdef, table)

    def scored_schedules(
        self,
        programs: list[Program | str],
        n: int = 1,
        greedy: bool = True,
        seed: int = 0,
        evaluator: Evaluator | None = None,
        rows: list[int] | None = None,
        threads: int | None = None,
    ) -> list[list[Scored]]:
        """Per program, up to `n` distinct schedules with their predicted speedups, best
        first: the greedy one (if `greedy`) and sampled ones, ranked by the surrogate, for
        kernels run on `threads` (default: the surrogate's count). `evaluator` (from
        `evaluator(programs, threads)`) saves compiling again for the same programs; `rows`
        then picks some of its programs (the answer is in their order)."""
        if n < 1:
            raise ConfigError(f"n must be at least 1, got {n}")
        if not programs and evaluator is None:
            return []
        if evaluator is None:
            programs = [p if isinstance(p, Program) else load_program(p) for p in programs]
            evaluator = self.evaluator(programs, threads)
        elif threads is not None and int(np.asarray(evaluator.table.threads)[0]) != threads:
            raise ConfigError(f"the evaluator's table is not at {threads} thread(s)")
        programs = evaluator.programs
        chosen = np.arange(len(programs)) if rows is None else np.asarray(rows, np.int64)
        if not len(chosen):
            return []
        reward_params = evaluator.prepare(self.surrogate.params)
        padded = np.resize(chosen, _bucket(len(chosen))).astype(np.int32)
        found: dict[int, dict[str, Scored]] = {int(r): {} for r in chosen}
        runs = []
        if greedy:
            key = jax.random.PRNGKey(seed)
            runs.append(evaluator.episodes(self.params, reward_params, padded, key, True))

        def collect(episodes) -> None:
            actions, steps = np.asarray(episodes.actions), np.asarray(episodes.steps)
            speedups = np.exp(np.asarray(episodes.log_speedup))
            for i, row in enumerate(np.asarray(episodes.states.program)):
                schedule, _ = replay(programs[row], actions[i, : steps[i]])
                found[int(row)].setdefault(schedule.hash, Scored(schedule, float(speedups[i])))

        for episodes in runs:
            collect(episodes)
        if n > 1 or not greedy:
            # a sharp policy repeats itself: the programs still short of n distinct schedules
            # are sampled again from flatter distributions
            for attempt, temperature in enumerate(SAMPLING_TEMPERATURES):
                short = [int(r) for r in chosen if len(found[int(r)]) < n]
                if not short:
                    break
                # one batch size for every attempt (one compile): the short programs share it
                repeated = np.resize(short, _bucket(len(chosen) * SAMPLES_PER_SCHEDULE * n))
                key = jax.random.PRNGKey(seed + 1 + attempt)
                collect(
                    evaluator.episodes(
                        self.params, reward_params, repeated, key, False, temperature
                    )
                )
        return [
            sorted(found[int(r)].values(), key=lambda s: -s.predicted_speedup)[:n] for r in chosen
        ]

    def refinements(
        self, evaluator: Evaluator, rows, per_program: int = 64, seed: int = 0
    ) -> dict[int, list[Scored]]:
        """Per table row: the heuristic's own schedule (first, unless it is empty) and the distinct refinements of
        it (`agent.refine`: one change, the policy's choices where the change leaves them
        open), each with its predicted speedup, the refinements best first."""
        from mlirrl_jax.agent.refine import forced_refinements
        from mlirrl_jax.env.replay import ScheduleError, schedule_to_actions, state_of_schedule
        from mlirrl_jax.heuristics import heuristic_schedule

        programs = evaluator.programs
        threads = np.asarray(evaluator.table.threads)
        rows = [int(r) for r in rows]
        reward_params = evaluator.prepare(self.surrogate.params)
        known, references = [], []
        for r in rows:
            heuristic = heuristic_schedule(programs[r], int(threads[r]))
            known.append(heuristic)
            try:
                references.append(schedule_to_actions(programs[r], heuristic, nearest=True))
            except ScheduleError:  # not expressible in the action space: the policy alone
                references.append([])
        predicted = np.exp(
            evaluator.score_states(
                reward_params,
                [state_of_schedule(programs[r], h).to_env_state(r) for r, h in zip(rows, known)],
            )
        )
        size = _bucket(len(rows) * per_program)
        forced = forced_refinements(references, per_program, size, seed)
        chosen = np.resize(np.repeat(np.asarray(rows, np.int32), per_program), size)
        episodes = evaluator.guided_episodes(
            self.params, reward_params, chosen, forced, jax.random.PRNGKey(seed + 7)
        )
        actions, steps = np.asarray(episodes.actions), np.asarray(episodes.steps)
        speedups = np.exp(np.asarray(episodes.log_speedup))
        found: dict[int, dict[str, Scored]] = {r: {} for r in rows}
        for i in range(len(rows) * per_program):
            row = int(chosen[i])
            schedule, _ = replay(programs[row], actions[i, : steps[i]])
            if schedule.ops:
                found[row].setdefault(
                    schedule.hash, Scored(schedule, float(speedups[i]), "refined")
                )
        out = {}
        for j, r in enumerate(rows):
            first = [Scored(known[j], float(predicted[j]), "heuristic")] if known[j].ops else []
            others = [s for h, s in found[r].items() if h != known[j].hash]
            out[r] = [*first, *sorted(others, key=lambda s: -s.predicted_speedup)]
        return out

    def proposals(
        self,
        programs: list[Program | str],
        n: int,
        start: str = "known",
        seed: int = 0,
        evaluator: Evaluator | None = None,
        threads: int | None = None,
        own: list[list[Scored]] | None = None,
    ) -> list[list[Scored]]:
        """Per program, the `n` schedules to measure. `start="scratch"`: the agent's own
        (`scored_schedules`, or `own` where the caller has them). `start="known"` (n >= 2):
        the heuristic's schedule, the surrogate's best refinements of it and the agent's own
        best, about half each."""
        if start not in STARTS:
            raise ConfigError(f"start {start!r}: expected one of {', '.join(STARTS)}")
        if evaluator is None:
            programs = [p if isinstance(p, Program) else load_program(p) for p in programs]
            evaluator = self.evaluator(programs, threads)
        if own is None:
            own = self.scored_schedules(None, n=n, seed=seed, evaluator=evaluator)
        if start == "scratch" or n < 2:
            return own
        rows = range(len(evaluator.programs))
        # as many refinements as sampled episodes: the same batch, so the same compiled runner
        known = self.refinements(evaluator, rows, SAMPLES_PER_SCHEDULE * n, seed)
        out = []
        for r in rows:
            heuristic = [s for s in known[r][:1] if s.origin == "heuristic"]
            refined = known[r][len(heuristic) :]
            # the heuristic's own, then its best refinements up to n - n // 2, then the
            # agent's own up to n; refinements again where the agent had too few distinct ones
            chosen, taken = [], set()
            for pool, limit in ((heuristic, 1), (refined, n - n // 2), (own[r], n), (refined, n)):
                for s in pool:
                    if len(chosen) >= limit:
                        break
                    if s.schedule.hash not in taken:
                        taken.add(s.schedule.hash)
                        chosen.append(s)
            out.append(sorted(chosen, key=lambda s: -s.predicted_speedup))
        return out

    def schedules(
        self,
        program_or_programs,
        n: int = 1,
        greedy: bool = True,
        seed: int = 0,
        threads: int | None = None,
    ) -> list[Schedule] | list[list[Schedule]]:
        """The agent's schedules of one program (a Program, a path or a URI: a list of up to
        `n`) or of a list of programs (a list of such lists), for kernels run on `threads`.
        `greedy` with n = 1: the most likely schedule."""
        single = isinstance(program_or_programs, Program | str | os.PathLike)
        programs = [program_or_programs] if single else list(program_or_programs)
        programs = [p if isinstance(p, Program) else load_program(str(p)) for p in programs]
        chosen = self.scored_schedules(programs, n, greedy, seed, threads=threads)
        out = [[s.schedule for s in per_program] for per_program in chosen]
        return out[0] if single else out
