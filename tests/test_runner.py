"""Measurement in workers: verified timing, illegal schedules, injected faults, the phases'
time limits and the reference outputs kept on disk."""

import numpy as np
import pytest

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.refcache import CACHE_ENV, ReferenceCache
from mlirrl_jax.measure.reference import compare, evaluate, random_inputs
from mlirrl_jax.measure.runner import Runner, timeout_phase
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.programs import generate as g
from mlirrl_jax.programs.ir import parse_program
from mlirrl_jax.schedule import Schedule, Transform

QUICK = TimingMethod(min_repeats=3, min_time_s=0.01)
MATMUL_VECTORIZED = Schedule.of(
    {1: [Transform("tile", (32, 32, 32)), Transform("tile", (8, 32, 1)), Transform("vectorize")]}
)


def test_baseline_is_verified_and_timed(runner, matmul):
    m = runner.measure(matmul, method=QUICK)
    assert m.status == "ok" and m.verified
    assert m.median_s > 0 and m.min_s <= m.median_s and m.repeats >= 3
    assert m.max_error <= m.tolerance
    assert m.fingerprint["machine"]["machine_id"] and m.fingerprint["toolchain"]["toolchain_id"]
    assert m.method["seed"] == 0 and m.schedule_hash == Schedule().hash


def test_scheduled_matmul_is_faster_and_verified(runner, matmul):
    base = runner.measure(matmul, method=QUICK)
    fast = runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK)
    assert fast.status == "ok" and fast.verified
    assert fast.median_s < base.median_s
    assert set(fast.compile_s) == {"transform_s", "lower_s", "jit_s"}


def test_illegal_schedule_is_a_compile_error(runner, matmul):
    # a 2-D convolution does not vectorize before it is decomposed to 1-D
    from mlirrl_jax.programs import generate as g
    from mlirrl_jax.programs.ir import parse_program

    conv = parse_program(g.render(g.Conv2dSpec("nhwc", 1, 6, 6, 4, 8, 3)), "conv")
    m = runner.measure(conv, Schedule.of({1: [Transform("vectorize")]}), method=QUICK)
    assert m.status == "compile_error" and "vectorize" in m.error
    assert m.median_s is None and not m.verified
    # 6 does not divide 64: the partial tile is peeled, and both copies vectorize
    partial = Schedule.of({1: [Transform("tile", (6, 32, 1)), Transform("vectorize")]})
    m = runner.measure(matmul, partial, method=QUICK)
    assert m.status == "ok" and m.verified


def test_schedule_that_does_not_fit_the_program(runner, matmul):
    m = runner.measure(matmul, Schedule.of({1: [Transform("tile", (8, 8))]}))
    assert m.status == "invalid_schedule" and "2 sizes for 3 loops" in m.error
    m = runner.measure(matmul, Schedule.of({7: [Transform("vectorize")]}))
    assert m.status == "invalid_schedule" and "op 7" in m.error
    m = runner.measure(matmul, Schedule.of({1: [Transform("tile_parallel", (8, 8, 8))]}))
    assert m.status == "invalid_schedule" and "reduction" in m.error


@pytest.mark.parametrize(
    "fault, status, words",
    [
        ("crash", "crash", "SIGABRT"),
        ("segfault", "crash", "SIGSEGV"),
        ("hang", "timeout", "kernel run"),
        ("wrong_output", "wrong_output", "differs from the reference"),
        ("oom", "oom", "MemoryError"),
    ],
)
def test_injected_faults_become_records_and_the_next_measurement_goes_on(
    matmul, fault, status, words
):
    # the faults are injected on purpose (a test-only request flag); everything else is real
    with Runner(timeout_s=4, mem_limit_mb=2048) as runner:
        m = runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK, inject_fault=fault)
        assert m.status == status and words in m.error
        assert m.median_s is None and not m.verified
        after = runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK)
        assert after.status == "ok" and after.verified


def test_compare_catches_small_and_unwritten_errors():
    ref = np.linspace(-1, 1, 100)
    assert compare(ref.astype(np.float32), ref, 1e-5)[0]
    wrong = ref.copy()
    wrong[17] += 1e-2
    assert not compare(wrong, ref, 1e-5)[0]
    unwritten = ref.copy()
    unwritten[3] = np.nan
    assert not compare(unwritten, ref, 1e-5)[0]


def test_parallel_variant_records_threads(runner, matmul):
    forall = Schedule.of(
        {
            1: [
                Transform("tile_parallel", (32, 0, 0)),
                Transform("tile", (8, 32, 1)),
                Transform("vectorize"),
            ]
        }
    )
    m = runner.measure(matmul, forall, threads=2, method=QUICK)
    assert m.status == "ok" and m.threads == 2 and m.runtime in ("async", "openmp")


def _matmul(n: int):
    spec = g.MatmulSpec(n, n, n)
    return parse_program(g.render(spec), spec.name)


def test_a_slow_reference_is_computed_outside_the_run_limit_once(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    big = _matmul(1024)  # its float64 reference takes ~5 s, a scheduled run ~60 ms
    schedule = heuristic_schedule(big, 1)
    with Runner(timeout_s=2) as runner:
        first = runner.measure(big, schedule, method=QUICK)
        assert first.status == "ok" and first.verified
        assert runner.last_reference["source"] == "computed"
        assert runner.last_reference["seconds"] > 2  # longer than the run limit, yet verified
        assert [p.name for p in tmp_path.iterdir()] == [ReferenceCache().path(big.hash, 0).name]
        again = runner.measure(big, MATMUL_VECTORIZED, method=QUICK)
        assert again.status == "ok" and runner.last_reference["source"] == "memory"
    with Runner(timeout_s=2) as fresh:  # another worker: the reference comes from the disk
        later = fresh.measure(big, schedule, method=QUICK)
        assert later.status == "ok" and later.verified
        assert fresh.last_reference["source"] == "disk"
        assert fresh.last_reference["seconds"] < 2


def test_a_damaged_cache_entry_is_computed_again(matmul, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cache = ReferenceCache()
    inputs = random_inputs(matmul, 0)
    assert cache.store(matmul.hash, 0, inputs, evaluate(matmul, inputs))
    with Runner() as runner:
        assert runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK).verified
        assert runner.last_reference["source"] == "disk"
    entry = cache.path(matmul.hash, 0)
    data = bytearray(entry.read_bytes())
    middle = len(data) // 2  # within the output's values: trusted, they would fail the kernel
    data[middle : middle + 64] = b"\x7f" * 64
    entry.write_bytes(bytes(data))
    with Runner() as runner:
        m = runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK)
        assert m.status == "ok" and m.verified
        assert runner.last_reference["source"] == "computed"


def test_each_phase_has_its_own_time_limit_and_names_it(matmul, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    with Runner(compile_timeout_s=0.01) as runner:  # a worker does not even start in 10 ms
        m = runner.measure(matmul, MATMUL_VECTORIZED, method=QUICK)
        assert m.status == "timeout" and timeout_phase(m) == "compile"
        assert m.error.startswith("compile not done within 0.01 s")
    mid = _matmul(512)  # its reference takes ~0.7 s, an unscheduled run ~0.25 s
    with Runner(reference_timeout_s=0.1) as runner:
        m = runner.measure(mid, method=QUICK)
        assert m.status == "timeout" and timeout_phase(m) == "reference"
        assert m.error.startswith("reference not computed within 0.1 s")
        assert set(m.compile_s) == {"transform_s", "lower_s", "jit_s"}  # compiling was done
        assert runner.last_reference is None
    with Runner(timeout_s=0.1) as runner:
        m = runner.measure(mid, method=QUICK)
        assert m.status == "timeout" and timeout_phase(m) == "run"
        assert m.error.startswith("kernel run (first call and timing) not done within 0.1 s")
        assert runner.last_reference["source"] == "computed"
        assert m.median_s is None and not m.verified


def test_a_runner_pins_its_workers_to_its_cores_and_leaves_the_environment_alone(matmul):
    import os

    from mlirrl_jax.measure.gate import MEASURE_CPUS

    core = max(os.sched_getaffinity(0))
    before = dict(os.environ)
    with Runner(cpus=(core,)) as runner:
        quick = TimingMethod(min_repeats=3, min_time_s=0.01)
        assert runner.measure(matmul, method=quick).ok
        assert os.sched_getaffinity(runner._worker.process.pid) == {core}
    assert dict(os.environ) == before and MEASURE_CPUS not in os.environ
    with Runner() as free:  # the default: this process's cores
        assert free.measure(matmul, method=quick).ok
        assert os.sched_getaffinity(free._worker.process.pid) == os.sched_getaffinity(0)
