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
    """A first run (on NaN-filled outputs) that is verified, then repeats until both minimums."""

    min_repeats: int = 5
    min_time_s: float = 0.1
    max_repeats: int = 10_000
    seed: int = 0  # random inputs are fixed by this seed
    timer: str = "time.perf_counter_ns"
    warmup: int = 1  # the verified run doubles as the warm-up


@dataclass
class TimingStats:
    median_s: float
    min_s: float
    spread: float  # interquartile range / median
    repeats: int


def time_calls(call, method: TimingMethod) -> TimingStats:
    """Call `call()` until `min_repeats` calls and `min_time_s` seconds have passed."""
    samples: list[float] = []
    total = 0.0
    while len(samples) < method.max_repeats and (
        len(samples) < method.min_repeats or total < method.min_time_s
    ):
        start = time.perf_counter_ns()
        call()
        elapsed = (time.perf_counter_ns() - start) * 1e-9
        samples.append(elapsed)
        total += elapsed
    median = statistics.median(samples)
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (median, 0, median)
    return TimingStats(median, min(samples), (q3 - q1) / median if median else 0.0, len(samples))


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
