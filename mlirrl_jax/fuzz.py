"""Random masked episodes, measured for real: what the masks allow must compile and verify.

Used by the fuzz benchmark (`bench/fuzz_masks.py`) and, on a small sample, by the tests.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from mlirrl_jax.env.jax_env import JaxEnv, sample_action
from mlirrl_jax.env.replay import replay
from mlirrl_jax.env.state import ProgramTable
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement, TimingMethod
from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule

# one verified run and one timed run: the fuzz checks legality, it does not benchmark
FUZZ_METHOD = TimingMethod(min_repeats=1, min_time_s=0.0)


@dataclass
class FuzzResult:
    program: str
    schedule: Schedule
    actions: list[np.ndarray]
    measurement: Measurement


def random_episodes(
    programs: list[Program], table: ProgramTable, n: int, seed: int, next_weight: float = 1.0
) -> Iterator[tuple[int, list[np.ndarray]]]:
    """(program index, applied actions) of `n` random masked episodes (see `sample_action`)."""
    env = JaxEnv(auto_reset=False)
    pool = jnp.arange(len(programs))
    step = jax.jit(env.step)
    reset = jax.jit(env.reset)
    draw = jax.jit(lambda k, m: sample_action(k, m, next_weight))
    key = jax.random.PRNGKey(seed)
    for _ in range(n):
        key, reset_key = jax.random.split(key)
        state, timestep = reset(reset_key, table, pool)
        actions = []
        while not bool(state.done):
            key, sub = jax.random.split(key)
            state, timestep = step(table, pool, state, draw(sub, timestep.observation.mask))
            actions.append(np.asarray(timestep.applied_action))
        yield int(state.program), actions


def fuzz(
    programs: list[Program],
    table: ProgramTable,
    n: int,
    seed: int,
    runner: Runner,
    next_weight: float = 1.0,
) -> Iterator[FuzzResult]:
    """Measure the schedules of `n` random masked episodes."""
    for index, actions in random_episodes(programs, table, n, seed, next_weight):
        schedule, _ = replay(programs[index], actions)
        measurement = runner.measure(programs[index], schedule, method=FUZZ_METHOD)
        yield FuzzResult(programs[index].name, schedule, actions, measurement)


def failure_kinds(results: list[FuzzResult]) -> dict[str, int]:
    """Failures grouped by status and the first words of their reason."""
    kinds = collections.Counter()
    for r in results:
        if not r.measurement.ok:
            reason = (r.measurement.error or "").split("Diagnostic message")[-1][:90]
            kinds[f"{r.measurement.status}: {reason}"] += 1
    return dict(kinds.most_common())
