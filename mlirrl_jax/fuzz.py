"""Random masked episodes, measured for real: what the masks allow must compile and verify.

Used by the fuzz benchmark (`bench/fuzz_masks.py`) and, on a small sample, by the tests.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import numpy as np

from mlirrl_jax.env.state import ProgramTable
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.sampler import EpisodeSampler, random_policy
from mlirrl_jax.schedule import Schedule

# one verified run and one timed run: the fuzz checks legality, it does not benchmark
FUZZ_METHOD = TimingMethod(min_repeats=1, min_time_s=0.0)


@dataclass
class FuzzResult:
    program: str
    schedule: Schedule
    actions: list[np.ndarray]
    measurement: Measurement


def fuzz(
    programs: list[Program],
    table: ProgramTable,
    n: int,
    seed: int,
    runner: Runner,
    next_weight: float = 1.0,
    threads: int = 1,
) -> Iterator[FuzzResult]:
    """Measure the schedules of `n` random masked episodes on randomly drawn programs, their
    foralls on `threads` threads."""
    sampler = EpisodeSampler(programs, random_policy(next_weight), table)
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    for _ in range(n):
        key, sub = jax.random.split(key)
        index = int(rng.integers(len(programs)))
        schedule, actions = sampler.schedule(index, sub)
        measurement = runner.measure(programs[index], schedule, threads=threads, method=FUZZ_METHOD)
        yield FuzzResult(programs[index].name, schedule, actions, measurement)


def failure_kinds(results: list[FuzzResult]) -> dict[str, int]:
    """Failures grouped by status and the first words of their reason."""
    kinds = collections.Counter()
    for r in results:
        if not r.measurement.ok:
            reason = (r.measurement.error or "").split("Diagnostic message")[-1][:90]
            kinds[f"{r.measurement.status}: {reason}"] += 1
    return dict(kinds.most_common())
