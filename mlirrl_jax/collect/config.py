"""What a collection job is asked for (`CollectConfig`, its sources' mix), one measurement task,
and the job's report."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from mlirrl_jax.errors import ConfigError, Error
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB
from mlirrl_jax.measure.timing import ADAPTIVE, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.shipped import default_store

log = logging.getLogger(__name__)


COMMIT_EVERY_S = 2.0
BACKENDS = ("local", "ray")
SOURCES = ("random", "heuristic", "agent", "uncertain")


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """`random:0.4,heuristic:0.4,agent:0.2` (a bare name has share 1) as (source, share)
    pairs, checked (`check_mix`); a share that is not a number is an error."""
    mix = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, share = part.partition(":")
        try:
            mix.append((name, float(share) if share else 1.0))
        except ValueError:
            raise ConfigError(f"--mix share of {name!r} is not a number: {share!r}") from None
    check_mix(mix)
    return tuple(mix)


def check_mix(mix) -> None:
    """Refuse a mix that names no source, an unknown one, or a share that is not a finite
    positive number: the shares are normalized into the probabilities sources are drawn by."""
    if not mix:
        raise ConfigError("--mix names no schedule source")
    for name, share in mix:
        if name not in SOURCES:
            raise ConfigError(f"unknown schedule source {name!r} in --mix; known: {SOURCES}")
        if not (math.isfinite(share) and share > 0):
            raise ConfigError(f"--mix share of {name!r} must be finite and positive, got {share}")


class BackendError(Error, ValueError):
    """A measurement backend that cannot run here."""


@dataclass
class CollectConfig:
    """What one collection job measures, and how."""

    store: Path = field(default_factory=lambda: Path(default_store()))  # the SQLite store
    suite: str = "dl-v0"  # built-in suite to sample programs from
    split: str = "train"  # split whose programs get sampled schedules
    budget: int | None = None  # stop when the store holds this many rows for the split here
    hours: float | None = None  # or stop after this long
    workers: int = 2  # measurements in flight at once
    # one kernel timed at a time, the other workers paused meanwhile (`measure.gate`): workers
    # compile and compute references on every core, and no timed run has a neighbour
    gate: bool = True
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
    # adaptive repeats: a long kernel whose calls agree stops after 2 of them (its first run
    # one of them), the others are timed as before (5 calls and 0.1 s at least)
    method: TimingMethod = ADAPTIVE
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
    time_cut: int = 0  # tasks left out at the caller's deadline
    stored_for_split: int = 0
    seconds: float = 0.0
    by_status: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.measured / self.seconds if self.seconds else 0.0
