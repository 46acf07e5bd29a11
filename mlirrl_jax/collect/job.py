"""The collection job itself (`CollectionJob`): its programs, the tasks drawn from each source
round-robin, skipped where the store has them or another job claims them, and the run."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

from mlirrl_jax.collect.backends import check_measure_cpus, import_ray
from mlirrl_jax.collect.config import (
    BACKENDS,
    BackendError,
    CollectConfig,
    CollectReport,
    Task,
    check_mix,
)
from mlirrl_jax.collect.stream import measure_stream
from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.interrupt import check_stop
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.profile import this_machine_profile
from mlirrl_jax.measure.runner import FAULTS
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.sampler import EpisodeSampler, Mutation, agent_policy, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.shipped import SHIPPED_AGENT
from mlirrl_jax.store import STORED, MeasurementStore
from mlirrl_jax.util.progress import progress_bar

log = logging.getLogger(__name__)


def suite_programs(config: CollectConfig, split: str) -> list[Program]:
    entries = suites.split(config.suite, split)
    if config.programs:
        entries = [e for e in entries if e.uri in config.programs]
    if config.max_mflops is not None:
        entries = [e for e in entries if e.flops <= config.max_mflops * 1e6]
    if config.max_programs:
        entries = entries[: config.max_programs]
    return [load_program(e.uri) for e in entries]


class SpreadChooser:
    """Active learning: of several drawn schedules of a program, the one a surrogate ensemble
    is least sure of (the largest spread of its members' predicted log times), predicted for
    this machine at the job's threads per kernel."""

    def __init__(self, surrogate: Path | None, programs: list[Program], threads: int):
        from mlirrl_jax.surrogate.api import CostModel
        from mlirrl_jax.surrogate.dataset import machine_table

        if surrogate is None:
            raise ConfigError("the uncertain source needs a surrogate ensemble (--surrogate DIR)")
        self.model = CostModel.load(surrogate)
        if self.model.members < 2:
            raise ConfigError(
                f"{surrogate}: one network has no spread; the uncertain source needs an "
                "ensemble (fit-cost-model --members 4)"
            )
        self.programs = programs
        self.table = machine_table(programs, this_machine_profile(), threads)

    def spreads(self, index: int, drawn: list[tuple[Schedule, list]]) -> np.ndarray:
        """The ensemble's spread of each drawn (schedule, actions) of program `index`."""
        from mlirrl_jax.actions import NEXT, encode_action
        from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS
        from mlirrl_jax.surrogate.dataset import featurize

        padded = np.tile(encode_action(NEXT), (len(drawn), MAX_EPISODE_STEPS, 1))
        for row, (_, actions) in enumerate(drawn):
            if actions:
                padded[row, : len(actions)] = np.stack(actions)
        ids = np.full(len(drawn), index, np.int32)
        states, _ = featurize(self.table, ids, padded.astype(np.int32))
        _, spread = self.model.predict_with_spread(self.table, states)
        return np.asarray(spread)

    def most_uncertain(self, index: int, drawn: list[tuple[Schedule, list]]) -> int:
        return int(np.argmax(self.spreads(index, drawn)))


class CollectionJob:
    """Measures sampled schedules until the budget or the time is spent."""

    def __init__(self, config: CollectConfig):
        if config.budget is None and config.hours is None:
            raise ConfigError("give a budget (measurements) or hours")
        unknown = set(config.inject_faults) - set(FAULTS)
        if unknown:
            raise ConfigError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        if config.backend not in BACKENDS:
            raise BackendError(f"unknown backend {config.backend!r}; known: {BACKENDS}")
        if config.address and config.backend != "ray":
            raise ConfigError(
                f"address {config.address!r} names a Ray cluster, which only the 'ray' backend "
                f"uses; this job's backend is {config.backend!r}"
            )
        if config.backend == "ray":
            import_ray()  # before the store exists: a job that cannot run creates nothing
        check_measure_cpus(config.measure_cpus, config.threads)
        check_mix(config.mix)
        # the store records this machine's profile with the first rows: measured (if it is not
        # cached) now, before the job's own kernels would slow it down
        this_machine_profile()
        self.config = config
        self.machine = machine_fingerprint()["machine_id"]
        self.store = MeasurementStore(config.store)
        try:
            self.programs = suite_programs(config, config.split)
            self.baseline_programs = list(self.programs)
            for split in config.baselines_of:
                if split != config.split:
                    self.baseline_programs += suite_programs(config, split)
            self.store.add_programs(self.baseline_programs)
            # schedules stored or in flight, by program hash
            self._known: dict[str, set[str]] = {p.hash: set() for p in self.baseline_programs}
            self._last_row = 0  # the store's last row seen
            self._claimed: dict[str, set[str]] = {}  # schedules jobs hold claims on, by program
            self._follow_store()
            check_stop()
        except BaseException:
            self.store.close()
            raise

    def _follow_store(self) -> None:
        """Follow the store: the rows stored since the last look (by other jobs too), and the
        tasks claimed now."""
        for row_id, program_hash, schedule_hash in self.store.keys_since(
            self._last_row, self.machine, self.config.threads
        ):
            if program_hash in self._known:
                self._known[program_hash].add(schedule_hash)
            self._last_row = row_id
        self._claimed = {}
        for program_hash, schedule_hash in self.store.claimed(self.machine, self.config.threads):
            self._claimed.setdefault(program_hash, set()).add(schedule_hash)

    def _skipped(self, task: Task, reason: str) -> None:
        """A task another job measures is not this job's to count (unless it is stored)."""
        if reason != STORED:
            self._known[task.program.hash].discard(task.schedule.hash)

    def stored_for_split(self) -> int:
        return sum(len(self._known[p.hash]) for p in self.programs)

    def _taken_for_split(self) -> int:
        """Schedules of the split stored, or being measured by this job or another."""
        return sum(
            len(self._known[p.hash] | self._claimed.get(p.hash, set())) for p in self.programs
        )

    def tasks(self) -> Iterator[Task]:
        """Baselines first, then schedules of the mix's sources round-robin over the
        programs, `per_visit` in a row of each. The heuristic source gives a program's
        heuristic schedule first, then mutations around it."""
        faults = list(self.config.inject_faults)
        for program in self.baseline_programs:
            if Schedule().hash not in self._known[program.hash]:
                self._known[program.hash].add(Schedule().hash)  # sampled empty schedules skip it
                yield Task(program, Schedule())
        sources = dict(self.config.mix)
        heuristic: dict[int, tuple[Schedule, list]] = {}  # by program index, when first drawn
        deep = EpisodeSampler(self.programs, random_policy(self.config.next_weight))
        uniform = EpisodeSampler(self.programs, random_policy(1.0), deep.table)
        agent = None
        if "agent" in sources:
            run = self.config.agent or SHIPPED_AGENT
            agent = EpisodeSampler(self.programs, agent_policy(run), deep.table)
        chooser = None
        if "uncertain" in sources:
            chooser = SpreadChooser(self.config.surrogate, self.programs, self.config.threads)
        names = list(sources)
        shares = np.array([sources[n] for n in names]) / sum(sources.values())
        rng = np.random.default_rng(self.config.seed)
        key = jax.random.PRNGKey(self.config.seed)
        order = rng.permutation(len(self.programs))
        stored_at_start = self.stored_for_split()
        misses = 0
        while True:
            for index in order:
                # up to `per_visit` new schedules of this program in a row; a draw the store
                # has is retried a few times within the visit
                wanted = max(1, self.config.per_visit)
                for _ in range(3 * wanted):
                    check_stop()  # a resumed job may fast-forward a while without yielding
                    key, sub = jax.random.split(key)
                    source = names[int(rng.choice(len(names), p=shares))]
                    if source == "agent":
                        schedule, _ = agent.schedule(int(index), sub)
                    elif source == "uncertain":
                        drawn = [
                            deep.schedule(int(index), k)
                            for k in jax.random.split(sub, self.config.candidates)
                        ]
                        known = self._known[self.programs[index].hash]
                        drawn = [d for d in drawn if d[0].hash not in known] or drawn
                        schedule = drawn[chooser.most_uncertain(int(index), drawn)][0]
                    elif source == "heuristic":
                        schedule, reference = self._heuristic(heuristic, int(index))
                        if schedule.hash in self._known[self.programs[index].hash]:
                            guide = Mutation(reference, rng)
                            schedule, _ = deep.schedule(int(index), sub, guide)
                    else:
                        sampler = uniform if rng.random() < self.config.uniform_share else deep
                        schedule, _ = sampler.schedule(int(index), sub)
                    known = self._known[self.programs[index].hash]
                    if schedule.hash in known:
                        misses += 1
                        continue
                    known.add(schedule.hash)  # in flight: not drawn twice
                    misses = 0
                    yield Task(self.programs[index], schedule, faults.pop(0) if faults else None)
                    wanted -= 1
                    if not wanted:
                        break
            # a rerun first draws again what the store has (each stored schedule skips once);
            # beyond that, a long run of known schedules means the space is exhausted
            if misses > 50 * len(self.programs) + stored_at_start:
                return

    def _heuristic(self, cache: dict, index: int) -> tuple[Schedule, list]:
        """The heuristic's schedule of program `index` at the job's threads, and the actions
        of the schedule nearest to it in the action space (what mutations start from)."""
        if index not in cache:
            program = self.programs[index]
            schedule = heuristic_schedule(program, threads=self.config.threads)
            cache[index] = (schedule, schedule_to_actions(program, schedule, nearest=True))
        return cache[index]

    def run(self, on_result: Callable[[Task, Measurement], None] | None = None) -> CollectReport:
        """Measure until the budget or the time is spent; each result also goes to
        `on_result`."""
        config = self.config
        report = CollectReport()
        start = time.monotonic()
        deadline = start + config.hours * 3600 if config.hours else None
        target = config.budget
        baselines = sum(
            Schedule().hash not in self._known[p.hash]
            for p in self.baseline_programs
            if p not in self.programs
        )
        remaining = max(0, target - self.stored_for_split()) + baselines if target else None
        bar = progress_bar(
            total=remaining,
            unit="meas",
            dynamic_ncols=True,
            smoothing=0.05,
            mininterval=1.0,
        )

        def done() -> bool:
            if deadline and time.monotonic() >= deadline:
                return True
            # what other jobs store and measure counts too; counting the tasks in flight keeps
            # the jobs together from overshooting the budget
            self._follow_store()
            return target is not None and self._taken_for_split() >= target

        try:
            measure_stream(
                self.tasks(),
                config,
                self.store,
                report,
                bar,
                done,
                on_result=on_result or (lambda task, measurement: None),
                on_skip=self._skipped,
            )
            self._follow_store()  # the rows other jobs stored meanwhile are the split's too
        finally:
            bar.close()
            report.seconds = time.monotonic() - start
            report.stored_for_split = self.stored_for_split()
            self.store.close()
        return report
