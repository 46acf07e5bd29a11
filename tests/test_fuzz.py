"""Masks never allow an illegal schedule: a fuzz sample, measured with the real pipeline."""

import pytest

from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.fuzz import failure_kinds, fuzz, remainder_tiles
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program
from mlirrl_jax.schedule import TILE, TILE_PARALLEL, Schedule, Transform


@pytest.fixture(scope="module")
def small_train_programs():
    # the train programs cheapest to run, so random (often unscheduled) ops stay fast
    entries = sorted(suites.split("dl-v0", "train"), key=lambda e: e.flops)[:40]
    return [load_program(e.uri) for e in entries]


@pytest.mark.slow
@pytest.mark.parametrize("next_weight", [1.0, 0.1])
def test_random_masked_episodes_compile_run_and_verify(runner, small_train_programs, next_weight):
    table = encode_programs(small_train_programs)
    results = list(
        fuzz(small_train_programs, table, 25, seed=123, runner=runner, next_weight=next_weight)
    )
    assert failure_kinds(results) == {}
    transforms = sum(len(o.transforms) for r in results for o in r.schedule.ops)
    assert transforms >= 25  # the sample does transform things


def test_remainder_tiles_counts_the_tiles_that_leave_a_partial_last_one():
    matmul = load_program(suites.split("awkward-v0", "test")[0].uri)  # 112 x 56 x 147
    assert [loop.extent for loop in matmul.ops[-1].loops] == [112, 56, 147]
    op = matmul.ops[-1].id

    def count(*steps):
        return remainder_tiles(matmul, Schedule.of([(op, list(steps))]))

    assert count(Transform(TILE, (16, 8, 7))) == 0  # every size divides
    assert count(Transform(TILE, (0, 32, 0))) == 1  # 56 = 32 + 24
    # the second level divides the first level's tiles, not the loop: 28 % 8 leaves 4
    assert count(Transform(TILE, (28, 0, 0)), Transform(TILE, (8, 0, 0))) == 1
    assert count(Transform(TILE_PARALLEL, (56, 0, 0)), Transform(TILE, (8, 0, 0))) == 0
