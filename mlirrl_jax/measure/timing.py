"""How a compiled kernel is verified and timed, and the Measurement record that comes back."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

STATUSES = (
    "ok",  # verified output, timed
    "wrong_output",  # ran, but the output did not match the reference: never timed
    "invalid_schedule",  # the schedule does not fit the program (caught before compiling)
    "compile_error",  # the transform script or the lowering failed with a diagnostic
    "crash",  # the worker died (compiler assertion, segfault in the kernel, ...)
    "timeout",  # the worker exceeded its time limit and was killed
    "oom",  # the worker exceeded its memory limit
    "reference_error",  # the program's reference output could not be computed
)


@dataclass(frozen=True)
class TimingMethod:
    """A first run (on NaN-filled outputs), then repeats until both minimums (or, adaptively,
    until the repeats agree: `converged_spread`); the outputs are verified after."""

    min_repeats: int = 5
    min_time_s: float = 0.1
    max_repeats: int = 10_000
    seed: int = 0  # random inputs are fixed by this seed
    timer: str = "time.perf_counter_ns"
    warmup: int = 1  # the first run is the warm-up
    # Adaptive repeats for long kernels: stop at `converged_repeats` calls (fewer than
    # `min_repeats`) once they have taken `min_time_s` and their interquartile range is within
    # this fraction of their median. Short kernels, whose calls cannot fill `min_time_s` by
    # then, run as before. 0 turns it off.
    converged_spread: float = 0.0
    converged_repeats: int = 2
    # a first run of at least this many seconds is a timed call too: a kernel that long warms
    # its caches within the call, and its data's pages are touched before it (0: never)
    first_call_counts_s: float = 0.0


# the method collection jobs time with: a kernel of 50 ms or more stops after 2 calls (its
# first included) when they agree within 2%
ADAPTIVE = TimingMethod(converged_spread=0.02, first_call_counts_s=0.05)


@dataclass
class TimingStats:
    median_s: float
    min_s: float
    spread: float  # interquartile range / median
    repeats: int


def _spread(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range / median) of `samples`."""
    median = statistics.median(samples)
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (median, 0, median)
    return median, (q3 - q1) / median if median else 0.0


def converged(samples: list[float], total: float, method: TimingMethod) -> bool:
    """Whether `samples` (seconds, `total` of them in all) may stop before `min_repeats`:
    enough of them, long enough, and in agreement (`TimingMethod.converged_spread`)."""
    return (
        method.converged_spread > 0
        and method.converged_repeats <= len(samples) < method.min_repeats
        and total >= method.min_time_s
        and _spread(samples)[1] <= method.converged_spread
    )


def time_calls(call, method: TimingMethod, first_call_s: float | None = None) -> TimingStats:
    """Call `call()` until `min_repeats` calls and `min_time_s` seconds have passed, or until
    `converged_repeats` calls that took `min_time_s` agree (`TimingMethod.converged_spread`).
    `first_call_s`, the first run's seconds, counts as a call if it is long enough
    (`TimingMethod.first_call_counts_s`)."""
    samples: list[float] = []
    counts = method.first_call_counts_s > 0 and (first_call_s or 0.0) >= method.first_call_counts_s
    if counts:
        samples.append(first_call_s)
    total = sum(samples)
    while len(samples) < method.max_repeats and (
        len(samples) < method.min_repeats or total < method.min_time_s
    ):
        start = time.perf_counter_ns()
        call()
        elapsed = (time.perf_counter_ns() - start) * 1e-9
        samples.append(elapsed)
        total += elapsed
        if converged(samples, total, method):
            break
    median, spread = _spread(samples)
    return TimingStats(median, min(samples), spread, len(samples))


@dataclass
class Measurement:
    """The result of measuring one (program, schedule) pair: always comes back, never raises."""

    status: str
    program: str
    program_hash: str
    schedule: dict
    schedule_hash: str
    threads: int = 1
    runtime: str = "sequential"
    median_s: float | None = None
    min_s: float | None = None
    spread: float | None = None
    repeats: int = 0
    verified: bool = False
    max_error: float | None = None
    tolerance: float | None = None
    compile_s: dict = field(default_factory=dict)  # transform_s, lower_s, jit_s
    wall_s: float | None = None  # the whole measurement, as the caller waited for it
    # where the rest of the time went: reference_s, first_call_s, verify_s, timing_s and, for
    # a gated worker (`measure.gate`), gate_wait_s
    phase_s: dict = field(default_factory=dict)
    error: str | None = None
    method: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)
    flops: int = 0
    created_at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def gflops(self) -> float | None:
        if not self.ok or not self.median_s or not self.flops:
            return None
        return self.flops / self.median_s * 1e-9

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Measurement:
        return cls(**data)

    def summary(self) -> str:
        if not self.ok:
            return f"{self.status}: {self.error or ''}"[:300]
        return f"{self.median_s * 1e3:.3f} ms (spread {self.spread:.1%}, {self.repeats} runs)"


def nan_filled(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An output buffer whose unwritten elements cannot pass verification."""
    if np.issubdtype(dtype, np.floating):
        return np.full(shape, np.nan, dtype=dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype=dtype)


def speedup(baseline: Measurement, scheduled: Measurement) -> float | None:
    if not (baseline.ok and scheduled.ok):
        return None
    return baseline.median_s / scheduled.median_s if scheduled.median_s else math.inf
