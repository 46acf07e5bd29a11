"""The timing gate: while one worker times its kernel every other worker of the job is paused,
the pause is not counted against the paused worker's limits, and adaptive repeats stop early
only on a steady kernel."""

import os
import threading
import time

import pytest

from mlirrl_jax.measure.gate import TimingGate
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod, converged, time_calls

pytestmark = pytest.mark.measures

LONG = TimingMethod(min_repeats=3, min_time_s=2.0)  # holds the gate for about 2 s
QUICK = TimingMethod(min_repeats=3, min_time_s=0.01)


def state(pid: int) -> str:
    """The process state letter of `pid` (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def while_timing(timed, matmul, look):
    """Time `matmul` for about 2 s on `timed`, calling `look()` meanwhile; the measurement and
    what `look` returned."""
    result, seen = {}, []
    thread = threading.Thread(
        target=lambda: result.setdefault("m", timed.measure(matmul, method=LONG))
    )
    thread.start()
    while thread.is_alive():
        seen.append(look())
        time.sleep(0.05)
    thread.join()
    assert result["m"].ok and result["m"].phase_s["timing_s"] >= 2.0
    return result["m"], seen


def test_with_no_core_to_spare_the_other_workers_are_paused_while_a_kernel_is_timed(matmul):
    gate = TimingGate(cpus=(0,))  # one core: the others cannot step aside
    with Runner(gate=gate) as timed, Runner(gate=gate) as other:
        assert other.measure(matmul, method=QUICK).ok  # starts its worker
        pid = other._worker.process.pid
        _, seen = while_timing(timed, matmul, lambda: state(pid))
        assert "T" in seen  # paused while the kernel ran
        assert state(pid) != "T"  # and running again after
        assert other.measure(matmul, method=QUICK).ok


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_the_other_workers_step_aside_to_the_spare_cores_while_a_kernel_is_timed(matmul):
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    gate = TimingGate(cpus=cores)
    with Runner(gate=gate) as timed, Runner(gate=gate) as other:
        assert other.measure(matmul, method=QUICK).ok and timed.measure(matmul, method=QUICK).ok
        pids = timed._worker.process.pid, other._worker.process.pid

        def look():
            return gate.holder is timed, [os.sched_getaffinity(p) for p in pids]

        _, seen = while_timing(timed, matmul, look)
        during = [cpus for holding, cpus in seen if holding]
        assert during and all(cpus == [{cores[0]}, {cores[1]}] for cpus in during[1:])
        assert [os.sched_getaffinity(p) for p in pids] == [set(cores)] * 2  # back after


def test_a_paused_worker_is_not_timed_out_for_the_pause_and_waits_its_turn(matmul, conv):
    gate = TimingGate(cpus=(0,))  # the others are paused
    hold = TimingMethod(min_repeats=3, min_time_s=4.0)
    with Runner(gate=gate) as timed, Runner(gate=gate) as waiting:
        # the worker starts under the default limit: its start-up on a loaded machine is not
        # what this test is about
        assert waiting.measure(matmul, method=QUICK).ok
        # then the second runner's compile limit is shorter than the first one's hold on the
        # gate, yet well above a small convolution's compile on a busy machine
        waiting.compile_timeout_s = 2.5
        first = {}
        thread = threading.Thread(
            target=lambda: first.setdefault("m", timed.measure(matmul, method=hold))
        )
        thread.start()
        while gate.holder is not timed:
            time.sleep(0.01)
        second = waiting.measure(conv, method=QUICK)
        thread.join()
    assert first["m"].ok
    assert second.ok, second.error
    assert waiting.workers_started == 1  # never killed for a timeout
    assert second.phase_s["gate_wait_s"] >= 0.0


def test_adaptive_repeats_stop_early_only_on_a_steady_long_call():
    adaptive = TimingMethod(min_repeats=5, min_time_s=0.1, converged_spread=0.02)
    # the rule, on given calls: two long calls that agree stop it, calls that differ do not,
    # and short calls go on to fill min_time_s
    assert converged([0.060, 0.0601], 0.1201, adaptive)
    assert not converged([0.060, 0.066], 0.126, adaptive)
    assert not converged([0.020, 0.0201], 0.0401, adaptive)
    assert not converged([0.060], 0.06, adaptive)
    assert not converged([0.06, 0.0601], 0.1201, TimingMethod(min_repeats=5, min_time_s=0.1))
    # and on real calls: a sleep's length varies by a millisecond or so on a loaded machine,
    # so the real steady call is judged at a 20% spread
    loose = TimingMethod(min_repeats=5, min_time_s=0.1, converged_spread=0.2)
    steady = time_calls(lambda: time.sleep(0.06), loose)
    assert steady.repeats == 2 and steady.spread <= 0.2  # the full method makes 5 calls
    delays = iter([0.06, 0.12] * 10)
    noisy = time_calls(lambda: time.sleep(next(delays)), adaptive)
    assert noisy.repeats == 5  # its calls never agreed: the full rule
    short = time_calls(lambda: time.sleep(0.002), adaptive)
    assert short.repeats >= 40  # a short kernel fills min_time_s as before


def test_a_long_first_call_is_timed_and_a_short_one_only_warms_up():
    method = TimingMethod(min_repeats=5, min_time_s=0.1, first_call_counts_s=0.05)
    calls = []
    long = time_calls(lambda: calls.append(time.sleep(0.06)), method, first_call_s=0.06)
    assert long.repeats == 5 and len(calls) == 4  # the first call is one of the five
    calls.clear()
    short = time_calls(lambda: calls.append(time.sleep(0.03)), method, first_call_s=0.03)
    assert len(calls) == short.repeats == 5
