"""One thread's streaming memory bandwidth: a copy between buffers far larger than the caches.

The memory-bound side of the roofline, as `peak.py` is the compute-bound side: a memory-bound
kernel on one thread runs at most this fast. NumPy's copy is one thread's plain loads and
stores; bytes are counted as STREAM counts a copy (read once, written once; the write-allocate
reads are not counted).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

BUFFER_MIB = 256  # per buffer: eight times the largest L3 of the machines measured so far


def stream_bandwidth_gbs(buffer_mib: int = BUFFER_MIB, repeats: int = 7) -> float:
    """GB/s (1e9 bytes) of copying one buffer of `buffer_mib` MiB into another on one thread,
    median of `repeats` copies after one untimed copy (which also faults the pages in)."""
    count = buffer_mib * (1 << 20) // 8
    source = np.ones(count, np.float64)
    target = np.empty_like(source)
    np.copyto(target, source)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        np.copyto(target, source)
        seconds.append((time.perf_counter_ns() - started) * 1e-9)
    return 2 * source.nbytes / statistics.median(seconds) * 1e-9
