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
from mlirrl_jax.schedule import TILE, TILING_KINDS, Schedule

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


def remainder_tiles(program: Program, schedule: Schedule) -> int:
    """How many `tile` steps of the schedule leave a partial last tile: a size that does not
    divide its loop's extent at that level (each op's own tilings; a fused producer's loops
    shrink further, which this does not follow)."""
    ops = {op.id: op for op in program.ops}
    count = 0
    for entry in schedule.ops:
        extents = [loop.extent for loop in ops[entry.op].loops]
        for t in entry.transforms:
            if t.kind not in TILING_KINDS:
                continue
            count += t.kind == TILE and any(s and e % s for s, e in zip(t.sizes, extents))
            extents = [s or e for s, e in zip(t.sizes, extents)]
    return count


def failure_kinds(results: list[FuzzResult]) -> dict[str, int]:
    """Failures grouped by status and the first words of their reason."""
    kinds = collections.Counter()
    for r in results:
        if not r.measurement.ok:
            reason = (r.measurement.error or "").split("Diagnostic message")[-1][:90]
            kinds[f"{r.measurement.status}: {reason}"] += 1
    return dict(kinds.most_common())
