"""The data-collection job: sample schedules, measure them for real, keep them in the store.

Work is spread round-robin over the suite's programs; each program's baseline (the empty
schedule) comes first, and the baselines of the held-out split are measured too. Schedules the
store already has are skipped, so rerunning the same command resumes the job: the episodes are
drawn from a fixed seed and fast-forward past what is stored. Measurements run in local worker
processes (threads each driving a `Runner`) or on a Ray cluster; results are committed in small
transactions.

Jobs on one store share the work: each task is claimed in the store before it is measured, and a
task another live job has claimed or stored is skipped, so two jobs (of the same seed too) never
measure one schedule twice; a job's budget counts the rows the others store. Timings taken while
another job measures on the same machine contend for its cores, so a job warns of the other.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from mlirrl_jax.env.replay import schedule_to_actions
from mlirrl_jax.errors import ConfigError, Error
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.interrupt import check_stop
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB, FAULTS, Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.measure.worker import MEASURE_CPUS
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import Program, load_program
from mlirrl_jax.sampler import EpisodeSampler, Mutation, agent_policy, random_policy
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.shipped import DEFAULT_STORE, SHIPPED_AGENT
from mlirrl_jax.store import STORED, ClaimOwner, MeasurementStore
from mlirrl_jax.util.progress import progress_bar

log = logging.getLogger(__name__)

COMMIT_EVERY_S = 2.0
BACKENDS = ("local", "ray")
SOURCES = ("random", "heuristic", "agent", "uncertain")


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """`random:0.4,heuristic:0.4,agent:0.2` (a bare name has share 1) as (source, share)
    pairs; an unknown source or a share that is not a positive number is an error."""
    mix = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, share = part.partition(":")
        if name not in SOURCES:
            raise ConfigError(f"unknown schedule source {name!r} in --mix; known: {SOURCES}")
        try:
            value = float(share) if share else 1.0
        except ValueError:
            raise ConfigError(f"--mix share of {name!r} is not a number: {share!r}") from None
        if not value > 0:
            raise ConfigError(f"--mix share of {name!r} must be positive, got {share}")
        mix.append((name, value))
    if not mix:
        raise ConfigError("--mix names no schedule source")
    return tuple(mix)


class BackendError(Error, ValueError):
    """A measurement backend that cannot run here."""


@dataclass
class CollectConfig:
    """What one collection job measures, and how."""

    store: Path = Path(DEFAULT_STORE)  # the SQLite measurement store
    suite: str = "dl-v0"  # built-in suite to sample programs from
    split: str = "train"  # split whose programs get sampled schedules
    budget: int | None = None  # stop when the store holds this many rows for the split here
    hours: float | None = None  # or stop after this long
    workers: int = 2  # measurements in flight at once
    # cores the measured kernels run on (empty: any); the job itself can then run elsewhere,
    # e.g. `taskset -c 1 mlirrl-jax collect --measure-cpus 0`
    measure_cpus: tuple[int, ...] = ()
    threads: int = 1  # threads per measured kernel
    seed: int = 0  # fixes the sampled episodes (a rerun resumes the same sequence)
    next_weight: float = 0.25  # <1: deeper schedules than uniform sampling
    uniform_share: float = 0.3  # share of random episodes drawn uniformly (next_weight = 1)
    # where schedules come from, with their shares (`SOURCES`): random episodes, the
    # heuristic's schedule and mutations around it, and a trained agent's samples
    mix: tuple[tuple[str, float], ...] = (("random", 0.4), ("heuristic", 0.4), ("agent", 0.2))
    agent: Path | None = None  # the agent whose samples the "agent" source draws (default: shipped)
    # the "uncertain" source: of `candidates` random episodes, the schedule this surrogate
    # ensemble (`ModelConfig.members` > 1) is least sure of, its members' largest spread
    surrogate: Path | None = None
    candidates: int = 16  # random episodes the uncertain source draws per schedule it measures
    # schedules drawn for a program before moving on to the next: a worker computes a program's
    # inputs and reference outputs once per visit, not once per schedule
    per_visit: int = 4
    baselines_of: tuple[str, ...] = ("train", "test")  # splits whose baselines are measured
    backend: str = "local"  # "local" worker processes or "ray"
    address: str | None = None  # Ray cluster address (backend "ray")
    timeout_s: float = 60.0
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB
    method: TimingMethod = field(default_factory=TimingMethod)
    max_programs: int | None = None  # only the first N programs of the split (tests, demos)
    max_mflops: float | None = None  # only programs of at most this many MFLOP
    programs: tuple[str, ...] = ()  # only these URIs of the split (tests, demos)
    inject_faults: tuple[str, ...] = ()  # testing only: faults for the first sampled tasks


@dataclass
class Task:
    program: Program
    schedule: Schedule
    fault: str | None = None


@dataclass
class CollectReport:
    measured: int = 0
    new_rows: int = 0
    failures: int = 0
    skipped: int = 0  # tasks another job had claimed or stored meanwhile
    stored_for_split: int = 0
    seconds: float = 0.0
    by_status: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.measured / self.seconds if self.seconds else 0.0


def _programs(config: CollectConfig, split: str) -> list[Program]:
    entries = suites.split(config.suite, split)
    if config.programs:
        entries = [e for e in entries if e.uri in config.programs]
    if config.max_mflops is not None:
        entries = [e for e in entries if e.flops <= config.max_mflops * 1e6]
    if config.max_programs:
        entries = entries[: config.max_programs]
    return [load_program(e.uri) for e in entries]


class _Backend:
    """Measurers (callables task -> Measurement), each serving one task at a time, driven by a
    thread pool: a thread waits on its measurer's worker, not on the GIL."""

    def __init__(
        self,
        measurers: list[Callable[[Task], Measurement]],
        shutdown: Callable[[], None],
        abort: Callable[[], None],
    ):
        self.free: queue.Queue = queue.Queue()
        for measurer in measurers:
            self.free.put(measurer)
        self.pool = ThreadPoolExecutor(len(measurers))
        self._shutdown = shutdown
        self._abort = abort

    def submit(self, task: Task) -> Future:
        return self.pool.submit(self._run, task)

    def _run(self, task: Task) -> Measurement:
        measurer = self.free.get()
        try:
            return measurer(task)
        finally:
            self.free.put(measurer)

    def abort(self) -> None:
        """Stop now (Ctrl-C): queued tasks are dropped and the measurements in flight killed,
        so `close` does not wait for them; their results are not stored."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._abort()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._shutdown()


def _measure_with(runner: Runner, task: Task, config: CollectConfig) -> Measurement:
    return runner.measure(
        task.program,
        task.schedule,
        threads=config.threads,
        method=config.method,
        inject_fault=task.fault,
    )


def local_workers(workers: int, threads: int, cpus: tuple[int, ...] = ()) -> int:
    """Kernels measured at once on this machine: at most `workers`, and no more than its
    cores (or `cpus`) hold at `threads` each, so that no two measured kernels share a core."""
    if cpus:
        cores = len(cpus)
    elif hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count()
    return max(1, min(workers, (cores or 1) // threads))


def check_measure_cpus(cpus: tuple[int, ...], threads: int) -> None:
    """Cores to measure on must exist here and hold one kernel of `threads` threads."""
    count = os.cpu_count() or 1
    missing = sorted(c for c in cpus if not 0 <= c < count)
    if missing:
        raise ConfigError(f"--measure-cpus {missing}: this machine has cores 0 to {count - 1}")
    if cpus and len(set(cpus)) < threads:
        raise ConfigError(
            f"--measure-cpus gives {len(set(cpus))} cores, fewer than the {threads} threads "
            "of one kernel"
        )


def _local_backend(config: CollectConfig) -> _Backend:
    """Measurement worker processes on this machine (`local_workers` of them), pinned to
    `config.measure_cpus` when given."""
    count = local_workers(config.workers, config.threads, config.measure_cpus)
    if config.measure_cpus:
        os.environ[MEASURE_CPUS] = ",".join(str(c) for c in sorted(set(config.measure_cpus)))
    runners = [Runner(config.timeout_s, config.mem_limit_mb) for _ in range(count)]
    measurers = [lambda task, r=runner: _measure_with(r, task, config) for runner in runners]
    return _Backend(
        measurers, lambda: [r.close() for r in runners], lambda: [r.abort() for r in runners]
    )


def _import_ray():
    """The ray module, or an error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendError(
            "the ray backend needs Ray, which is not installed: pip install 'mlirrl-jax[cluster]'"
            " (or pip install ray)"
        ) from None
    return ray


def _ray_backend(config: CollectConfig) -> _Backend:
    """Ray actors, each holding a Runner (its own measurement worker) on a cluster node."""
    ray = _import_ray()

    @ray.remote(num_cpus=1)
    class MeasureActor:
        def __init__(self):
            self.runner = Runner(config.timeout_s, config.mem_limit_mb)

        def measure(self, task: Task) -> Measurement:
            return _measure_with(self.runner, task, config)

    ray.init(address=config.address, ignore_reinit_error=True, log_to_driver=False)
    actors = [MeasureActor.remote() for _ in range(config.workers)]
    measurers = [lambda task, a=actor: ray.get(a.measure.remote(task)) for actor in actors]
    return _Backend(measurers, ray.shutdown, lambda: [ray.kill(a) for a in actors])


class SpreadChooser:
    """Active learning: of several drawn schedules of a program, the one a surrogate ensemble
    is least sure of (the largest spread of its members' predicted log times), predicted for
    this machine at the job's threads per kernel."""

    def __init__(self, surrogate: Path | None, programs: list[Program], threads: int):
        from cost_model.api import CostModel
        from cost_model.dataset import machine_table
        from mlirrl_jax.measure.profile import this_machine_profile

        if surrogate is None:
            raise ConfigError("the uncertain source needs a surrogate ensemble (--surrogate DIR)")
        self.model = CostModel.load(surrogate)
        members = self.model.meta["train"]["model"].get("members", 1)
        if members < 2:
            raise ConfigError(
                f"{surrogate}: one network has no spread; the uncertain source needs an "
                "ensemble (fit-cost-model --members 4)"
            )
        self.programs = programs
        self.table = machine_table(programs, this_machine_profile(), threads)

    def spreads(self, index: int, drawn: list[tuple[Schedule, list]]) -> np.ndarray:
        """The ensemble's spread of each drawn (schedule, actions) of program `index`."""
        from cost_model.dataset import featurize
        from mlirrl_jax.actions import NEXT, encode_action
        from mlirrl_jax.env.jax_env import MAX_EPISODE_STEPS

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
        if config.backend == "ray":
            _import_ray()  # before the store exists: a job that cannot run creates nothing
        check_measure_cpus(config.measure_cpus, config.threads)
        unknown = {name for name, _ in config.mix} - set(SOURCES)
        if unknown or not config.mix or any(not share > 0 for _, share in config.mix):
            raise ConfigError(f"bad schedule mix {config.mix}: sources {SOURCES}, positive shares")
        self.config = config
        self.machine = machine_fingerprint()["machine_id"]
        self.store = MeasurementStore(config.store)
        try:
            self.programs = _programs(config, config.split)
            self.baseline_programs = list(self.programs)
            for split in config.baselines_of:
                if split != config.split:
                    self.baseline_programs += _programs(config, split)
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

    def run(self) -> CollectReport:
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
                self.tasks(), config, self.store, report, bar, done, on_skip=self._skipped
            )
            self._follow_store()  # the rows other jobs stored meanwhile are the split's too
        finally:
            bar.close()
            report.seconds = time.monotonic() - start
            report.stored_for_split = self.stored_for_split()
            self.store.close()
        return report


def measure_stream(
    tasks: Iterator[Task],
    config: CollectConfig,
    store: MeasurementStore,
    report: CollectReport,
    bar: tqdm | None = None,
    done: Callable[[], bool] = lambda: False,
    on_result: Callable[[Task, Measurement], None] = lambda task, measurement: None,
    on_skip: Callable[[Task, str], None] = lambda task, reason: None,
) -> CollectReport:
    """Measure `tasks` on the config's backend, `2 x workers` in flight, until they run out or
    `done()`; results go to `store` in a transaction every `COMMIT_EVERY_S` (a kill loses at
    most those in flight and uncommitted) and to `on_result`; tallies go to `report`. On
    Ctrl-C the results in hand are committed and the measurements in flight are killed.

    Each task is claimed in the store before it is measured; one that another job has claimed
    or stored meanwhile goes to `on_skip` with the reason instead. Claims are released as the
    results are stored and when the stream ends."""
    owner = ClaimOwner.here()
    machine = machine_fingerprint()["machine_id"]
    warned: set[int] = set()

    def warn_of_other_jobs() -> None:
        for pid in sorted(store.other_claimants(owner) - warned):
            warned.add(pid)
            log.warning(
                "warning: another job (pid %d) is measuring into %s on this machine too; "
                "timings taken meanwhile contend for its cores",
                pid,
                store.path,
            )

    warn_of_other_jobs()
    backend = _ray_backend(config) if config.backend == "ray" else _local_backend(config)
    pending: dict[Future, Task] = {}
    buffer: list[Measurement] = []
    last_commit = time.monotonic()

    def commit() -> None:
        nonlocal last_commit
        if buffer:
            report.new_rows += store.put(buffer, claimed_by=owner)
            buffer.clear()
        last_commit = time.monotonic()
        warn_of_other_jobs()

    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2 * config.workers and not done():
                task = next(tasks, None)
                check_stop()  # drawing a task may have built the sampler (start-up)
                if task is None:
                    exhausted = True
                    break
                key = (task.program.hash, task.schedule.hash, machine, config.threads)
                refused = store.claim(*key, owner)
                if refused is not None:
                    report.skipped += 1
                    on_skip(task, refused)
                    continue
                pending[backend.submit(task)] = task
            if not pending:
                break
            finished, _ = wait(list(pending), timeout=1.0, return_when=FIRST_COMPLETED)
            check_stop()
            for future in finished:
                task = pending.pop(future)
                measurement = future.result()
                buffer.append(measurement)
                report.measured += 1
                report.by_status[measurement.status] = (
                    report.by_status.get(measurement.status, 0) + 1
                )
                if not measurement.ok:
                    report.failures += 1
                on_result(task, measurement)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(failures=report.failures, refresh=False)
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                commit()
            if done() and not pending:
                break
    except KeyboardInterrupt:
        backend.abort()
        raise
    finally:
        try:
            commit()
        finally:
            store.release(owner)
            backend.close()
    return report
