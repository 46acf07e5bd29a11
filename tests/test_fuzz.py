"""Masks never allow an illegal schedule: a fuzz sample, measured with the real pipeline."""

import pytest

from mlirrl_jax.env.state import encode_programs
from mlirrl_jax.fuzz import failure_kinds, fuzz
from mlirrl_jax.programs import suites
from mlirrl_jax.programs.ir import load_program


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
