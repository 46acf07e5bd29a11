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
from mlirrl_jax.util.configs import option

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
    """What one collection job measures, and how.

    Its fields are declared alike, each documented (`util.configs.option`): the flags and
    their help come from them (`cli.options`).
    """

    store: Path = option(factory=lambda: Path(default_store()), doc="the SQLite store")
    suite: str = option("dl-v0", doc="built-in suite to sample programs from")
    split: str = option("train", doc="split whose programs get sampled schedules")
    budget: int | None = option(
        None, doc="stop when the store holds this many rows for the split here"
    )
    hours: float | None = option(None, doc="or stop after this long")
    workers: int = option(2, doc="measurements in flight at once")
    gate: bool = option(
        True,
        doc=(
            "one kernel timed at a time, the other workers paused meanwhile (`measure.gate`):"
            " workers compile and compute references on every core, and no timed run has a "
            "neighbour"
        ),
    )
    measure_cpus: tuple[int, ...] = option(
        (),
        doc=(
            "cores the measured kernels run on (empty: any); the job itself can then run "
            "elsewhere, e.g. `taskset -c 1 mlirrl-jax collect --measure-cpus 0`"
        ),
    )
    threads: int = option(1, doc="threads per measured kernel")
    seed: int = option(0, doc="fixes the sampled episodes (a rerun resumes the same sequence)")
    next_weight: float = option(0.25, doc="<1: deeper schedules than uniform sampling")
    uniform_share: float = option(
        0.3, doc="share of random episodes drawn uniformly (next_weight = 1)"
    )
    mix: tuple[tuple[str, float], ...] = option(
        (("random", 0.4), ("heuristic", 0.4), ("agent", 0.2)),
        doc=(
            "where schedules come from, with their shares (`SOURCES`): random episodes, the "
            "heuristic's schedule and mutations around it, and a trained agent's samples"
        ),
    )
    agent: Path | None = option(
        None, doc='the agent whose samples the "agent" source draws (default: shipped)'
    )
    surrogate: Path | None = option(
        None,
        doc=(
            'the "uncertain" source: of `candidates` random episodes, the schedule this '
            "surrogate ensemble (`ModelConfig.members` > 1) is least sure of, its members' "
            "largest spread"
        ),
    )
    candidates: int = option(
        16, doc="random episodes the uncertain source draws per schedule it measures"
    )
    per_visit: int = option(
        4,
        doc=(
            "schedules drawn for a program before moving on to the next: a worker computes a "
            "program's inputs and reference outputs once per visit, not once per schedule"
        ),
    )
    baselines_of: tuple[str, ...] = option(
        ("train", "test"), doc="splits whose baselines are measured"
    )
    backend: str = option("local", doc='"local" worker processes or "ray"')
    address: str | None = option(None, doc='Ray cluster address (backend "ray")')
    timeout_s: float = 60.0
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB
    method: TimingMethod = option(
        ADAPTIVE,
        doc=(
            "adaptive repeats: a long kernel whose calls agree stops after 2 of them (its "
            "first run one of them), the others are timed as before (5 calls and 0.1 s at "
            "least)"
        ),
    )
    max_programs: int | None = option(
        None, doc="only the first N programs of the split (tests, demos)"
    )
    max_mflops: float | None = option(None, doc="only programs of at most this many MFLOP")
    programs: tuple[str, ...] = option((), doc="only these URIs of the split (tests, demos)")
    inject_faults: tuple[str, ...] = option(
        (), doc="testing only: faults for the first sampled tasks"
    )


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
