"""Evolutionary search guided by the surrogate: the search a user would pick instead of an
agent (Ansor's, MetaSchedule's), and the baseline the agent has to beat at equal budgets.

Each generation draws candidates: mutations of the best schedules measured so far (the
heuristic's schedule is measured first and seeds them, beside any schedules measured before
the search, such as the heuristic's and the agent's in a job that measured them: `known`,
neither measured again nor among the search's trials; at more than one thread, the
best of those with every op left on one thread split over the threads is measured first,
`split_schedule_over_threads`) and fresh random episodes. The
surrogate ranks the distinct candidates not measured yet; the top `batch` are measured for
real; the surrogate (the prior given) is fine-tuned on every verified measurement so far
before the next generation. Every candidate comes out of the environment's masks (random episodes, and
mutations whose changes the masks repair: `sampler.Mutation`), so every schedule measured is
one the agent could have chosen. The search spends exactly `budget` measurements (a crash,
timeout or wrong output counts, and is data), fewer only when the space runs out of distinct
schedules.

`EvolutionarySearch(program, surrogate, threads).run(measure)` with `measure(schedule) ->
Measurement` (a `Runner`'s, say); the result lists every trial in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np

from mlirrl_jax.errors import Error
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule, ScheduleError

log = logging.getLogger(__name__)


class SearchError(Error, ValueError):
    """A search configuration that cannot run."""


@dataclass(frozen=True)
class EvolutionConfig:
    """How the evolutionary search spends its measurements."""

    budget: int = 64  # real measurements, exactly
    batch: int = 8  # measured per generation, the surrogate's top candidates
    candidates: int = 64  # drawn per generation (mutants and fresh episodes)
    parents: int = 4  # the best measured schedules mutated
    fresh_share: float = 0.25  # share of the candidates drawn as fresh random episodes
    update_epochs: int = 10  # surrogate fine-tuning between generations (0: never)
    next_weight: float = 0.25  # of the random policy: <1 draws deeper schedules
    seed: int = 0

    def __post_init__(self):
        for name in ("budget", "batch", "candidates", "parents"):
            if getattr(self, name) < 1:
                raise SearchError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.candidates < self.batch:
            raise SearchError(
                f"candidates ({self.candidates}) must be at least batch ({self.batch})"
            )
        if not 0.0 <= self.fresh_share <= 1.0:
            raise SearchError(f"fresh_share must be within [0, 1], got {self.fresh_share}")
        if self.update_epochs < 0:
            raise SearchError(f"update_epochs must be at least 0, got {self.update_epochs}")


@dataclass
class Trial:
    """One measured schedule, and the speedup over the unscheduled program the surrogate
    predicted for it before it was measured."""

    schedule: Schedule
    measurement: Measurement
    predicted_speedup: float | None
    generation: int
    origin: str  # known (measured before, not spent), split, heuristic, mutant or fresh

    @property
    def seconds(self) -> float | None:
        m = self.measurement
        return m.median_s if m.ok and m.verified and m.median_s else None


@dataclass
class SearchResult:
    trials: list[Trial] = field(default_factory=list)
    generations: int = 0
    updates: int = 0  # surrogate fine-tunings
    seconds: float = 0.0

    @property
    def best(self) -> Trial | None:
        good = [t for t in self.trials if t.seconds is not None]
        return min(good, key=lambda t: t.seconds) if good else None

    @property
    def failed(self) -> int:
        return sum(t.seconds is None for t in self.trials)


def split_schedule_over_threads(
    program: Program, schedule: Schedule, threads: int
) -> Schedule | None:
    """`schedule` with every op it tiles but leaves on one thread (no `tile_parallel` or
    `tile_fuse`) split over `threads` first: its outermost parallel loop that divides into
    chunks of whole tiles of the op's last tiling (`heuristics.parallel_tile`); None if that
    changes nothing (one thread, a schedule that fuses, or no op splits)."""
    from mlirrl_jax.heuristics import parallel_tile
    from mlirrl_jax.schedule import TILE, TILE_FUSE, TILE_PARALLEL, Transform

    fuses = any(t.kind == TILE_FUSE for entry in schedule.ops for t in entry.transforms)
    if threads < 2 or fuses:  # a fused producer runs in its consumer's threads already
        return None
    per_op, changed = [], False
    by_id = {op.id: op for op in program.ops}
    for entry in schedule.ops:  # in the schedule's own order (consumers first)
        op, steps = by_id[entry.op], list(entry.transforms)
        tiles = [t.sizes for t in steps if t.kind == TILE]
        if tiles and not any(t.kind in (TILE_PARALLEL, TILE_FUSE) for t in steps):
            reg = tuple(s or loop.extent for s, loop in zip(tiles[-1], op.loops, strict=True))
            sizes = parallel_tile(op, threads, reg)
            if sizes is not None:
                steps, changed = [Transform(TILE_PARALLEL, sizes), *steps], True
        if steps:
            per_op.append((op.id, steps))
    return Schedule.of(per_op) if changed else None


class EvolutionarySearch:
    """The search on one program at `threads` per kernel, on this machine's profile."""

    def __init__(
        self,
        program: Program,
        surrogate,
        threads: int = 1,
        config: EvolutionConfig | None = None,
        profile=None,
    ):
        from mlirrl_jax.measure.profile import this_machine_profile
        from mlirrl_jax.sampler import EpisodeSampler, random_policy
        from mlirrl_jax.surrogate.dataset import machine_table

        self.program = program
        self.prior = surrogate  # each update starts again from it, on every row so far
        self.surrogate = surrogate
        self.threads = threads
        self.config = config or EvolutionConfig()
        self.profile = profile if profile is not None else this_machine_profile()
        self.table = machine_table([program], self.profile, threads)
        self.sampler = EpisodeSampler([program], random_policy(self.config.next_weight), self.table)

    def predict(self, drawn: list[list[np.ndarray]]) -> np.ndarray:
        """The surrogate's predicted speedup over the unscheduled program of each action
        sequence."""
        from mlirrl_jax.actions import NEXT, encode_action
        from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS
        from mlirrl_jax.surrogate.dataset import featurize

        drawn = [[], *drawn]  # the unscheduled program first
        padded = np.tile(encode_action(NEXT), (len(drawn), MAX_EPISODE_STEPS, 1))
        for row, actions in enumerate(drawn):
            if actions:
                padded[row, : len(actions)] = np.stack(actions)
        states, _ = featurize(self.table, np.zeros(len(drawn), np.int32), padded.astype(np.int32))
        log_s = np.asarray(self.surrogate.predict(self.table, states), np.float64)
        return np.exp(log_s[0] - log_s[1:])

    def _dataset(self, trials: list[tuple[list[np.ndarray], Trial]]):
        """The verified trials as a dataset the surrogate can be fine-tuned on."""
        from mlirrl_jax.actions import NEXT, encode_action
        from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS
        from mlirrl_jax.surrogate.dataset import Dataset, featurize

        padded = np.tile(encode_action(NEXT), (len(trials), MAX_EPISODE_STEPS, 1))
        for row, (actions, _) in enumerate(trials):
            if actions:
                padded[row, : len(actions)] = np.stack(actions)
        states, feats = featurize(
            self.table, np.zeros(len(trials), np.int32), padded.astype(np.int32)
        )
        machine = self.profile.machine_id if self.profile is not None else ""
        return Dataset(
            states=states,
            features=feats,
            log_time=np.log([t.seconds for _, t in trials]).astype(np.float32),
            program=np.zeros(len(trials), np.int32),
            is_baseline=np.array([t.schedule.is_empty for _, t in trials]),
            programs=[self.program],
            families=["user"],
            table=self.table,
            machines=[machine],
            threads=[self.threads],
            profiles={machine: self.profile} if self.profile is not None else {},
        )

    def run(
        self,
        measure: Callable[[Schedule], Measurement],
        baseline: Measurement | None = None,
        progress: Callable[[str], None] | None = None,
        known: list[tuple[Schedule, Measurement]] = (),
    ) -> SearchResult:
        """Spend the budget; `baseline` (the unscheduled run, verified) joins the surrogate's
        fine-tuning data, so that it learns speedups, not only times. `known`: schedules
        measured before (the agent's proposals, by the same runner and method), parents and
        fine-tuning data from the start, not measured again and not counted in the budget or
        the trials."""
        from mlirrl_jax.env.replay import schedule_to_actions
        from mlirrl_jax.sampler import Mutation

        config, started = self.config, time.perf_counter()
        rng = np.random.default_rng(config.seed)
        key = jax.random.PRNGKey(config.seed)
        result = SearchResult()
        measured: list[tuple[list[np.ndarray], Trial]] = []
        seen: set[str] = {Schedule().hash}
        fit_rows: list[tuple[list[np.ndarray], Trial]] = []
        if baseline is not None and baseline.ok and baseline.verified and baseline.median_s:
            fit_rows.append(([], Trial(Schedule(), baseline, None, 0, "baseline")))

        def spend(actions, schedule, predicted, generation, origin) -> None:
            trial = Trial(schedule, measure(schedule), predicted, generation, origin)
            seen.add(schedule.hash)
            measured.append((actions, trial))
            result.trials.append(trial)
            if progress:
                elapsed = time.perf_counter() - started
                done = len(result.trials)
                best = result.best
                progress(
                    f"  evolutionary {done}/{config.budget} (generation {generation}, {origin}): "
                    f"{trial.measurement.summary()}; best "
                    f"{best.seconds * 1e3 if best else float('nan'):.3f} ms; "
                    f"{done / elapsed:.2f} meas/s, ETA {(config.budget - done) * elapsed / done:.0f} s"
                )

        lanes = self.profile.vector_lanes if self.profile else None
        for schedule, m in known:
            if schedule.hash in seen:
                continue
            seen.add(schedule.hash)
            actions = schedule_to_actions(self.program, schedule, lanes, nearest=True)
            measured.append((actions, Trial(schedule, m, None, 0, "known")))
        # the known schedules' ops that run on one thread, split over the threads: a change
        # no single mutation makes (ResNet-18's 3x3 convolution at two threads: 2.16 ms as the
        # agent picked it, 1.19 ms split)
        best_known = sorted(
            (item for item in measured if item[1].seconds is not None),
            key=lambda item: item[1].seconds,
        )[: config.parents]
        for _, trial in best_known:
            variant = split_schedule_over_threads(self.program, trial.schedule, self.threads)
            if variant is None or variant.hash in seen or len(result.trials) >= config.budget:
                continue
            try:
                actions = schedule_to_actions(self.program, variant, lanes, nearest=True)
            except ScheduleError:  # outside the action space: not proposed
                continue
            spend(actions, variant, float(self.predict([actions])[0]), 0, "split")
        heuristic = heuristic_schedule(self.program, threads=self.threads)
        if (
            not heuristic.is_empty
            and heuristic.hash not in seen
            and len(result.trials) < config.budget
        ):
            actions = schedule_to_actions(self.program, heuristic, lanes, nearest=True)
            spend(actions, heuristic, float(self.predict([actions])[0]), 0, "heuristic")
        generation, dry = 0, 0
        while len(result.trials) < config.budget:
            generation += 1
            good = sorted(
                (item for item in measured if item[1].seconds is not None),
                key=lambda item: item[1].seconds,
            )[: config.parents]
            drawn: dict[str, tuple[list[np.ndarray], Schedule, str]] = {}
            for i in range(config.candidates):
                key, sub = jax.random.split(key)
                fresh = not good or rng.random() < config.fresh_share
                guide = None if fresh else Mutation(good[i % len(good)][0], rng)
                schedule, actions = self.sampler.schedule(0, sub, guide)
                if schedule.hash not in seen:
                    drawn.setdefault(
                        schedule.hash, (actions, schedule, "fresh" if fresh else "mutant")
                    )
            if not drawn:
                dry += 1
                if dry >= 3:  # the space has run out of distinct schedules
                    log.info("%s: no new schedule in 3 generations", self.program.name)
                    break
                continue
            dry = 0
            items = list(drawn.values())
            predicted = self.predict([a for a, _, _ in items])
            wanted = min(config.batch, config.budget - len(result.trials))
            for j in np.argsort(-predicted)[:wanted]:
                actions, schedule, origin = items[int(j)]
                spend(actions, schedule, float(predicted[j]), generation, origin)
            verified = fit_rows + [item for item in measured if item[1].seconds is not None]
            if (
                config.update_epochs
                and len(result.trials) < config.budget
                and len(verified) >= 2
                and hasattr(self.surrogate, "update")
            ):
                self.surrogate = self.prior.update(
                    self._dataset(verified),
                    epochs=config.update_epochs,
                    machine_id=self.profile.machine_id if self.profile is not None else None,
                    threads=self.threads,
                    note=f"evolutionary search on {self.program.name}",
                )
                result.updates += 1
        result.generations = generation
        result.seconds = time.perf_counter() - started
        return result
