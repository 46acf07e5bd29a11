"""Where a collection job's measurements run: local worker threads, each driving a `Runner` on
cores of its own, or actors on a Ray cluster; the same `Backend` to the job either way."""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mlirrl_jax.collect.config import BackendError, CollectConfig, Task
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.measure.gate import TimingGate
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import Measurement

log = logging.getLogger(__name__)


class Backend:
    """Measurers (callables task -> Measurement), each serving one task at a time, driven by a
    thread pool: a thread waits on its measurer's worker, not on the GIL."""

    def __init__(
        self,
        measurers: list[Callable[[Task], Measurement]],
        shutdown: Callable[[], None],
        abort: Callable[[], None],
    ):
        self.free: queue.Queue = queue.Queue()
        for measurer in measurers:
            self.free.put(measurer)
        self.pool = ThreadPoolExecutor(len(measurers))
        self._shutdown = shutdown
        self._abort = abort

    def submit(self, task: Task) -> Future:
        return self.pool.submit(self._run, task)

    def _run(self, task: Task) -> Measurement:
        measurer = self.free.get()
        try:
            return measurer(task)
        finally:
            self.free.put(measurer)

    def abort(self) -> None:
        """Stop now (Ctrl-C): queued tasks are dropped and the measurements in flight killed,
        so `close` does not wait for them; their results are not stored."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._abort()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._shutdown()


def measure_task(runner: Runner, task: Task, config: CollectConfig) -> Measurement:
    return runner.measure(
        task.program,
        task.schedule,
        threads=config.threads,
        method=config.method,
        inject_fault=task.fault,
    )


def local_workers(
    workers: int, threads: int, cpus: tuple[int, ...] = (), gated: bool = False
) -> int:
    """Worker processes on this machine: at most `workers`, and no more than its cores (or
    `cpus`) hold. Gated workers (`measure.gate`) time one kernel at a time, so each may
    compile on a core of its own; otherwise each needs `threads` cores of its own, so that no
    two measured kernels share a core."""
    if cpus:
        cores = len(cpus)
    elif hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count()
    return max(1, min(workers, (cores or 1) // (1 if gated else threads)))


def check_measure_cpus(cpus: tuple[int, ...], threads: int) -> None:
    """Cores to measure on must exist here and hold one kernel of `threads` threads."""
    count = os.cpu_count() or 1
    missing = sorted(c for c in cpus if not 0 <= c < count)
    if missing:
        raise ConfigError(f"--measure-cpus {missing}: this machine has cores 0 to {count - 1}")
    if cpus and len(set(cpus)) < threads:
        raise ConfigError(
            f"--measure-cpus gives {len(set(cpus))} cores, fewer than the {threads} threads "
            "of one kernel"
        )


def local_backend(config: CollectConfig) -> Backend:
    """Measurement worker processes on this machine (`local_workers` of them), pinned to
    `config.measure_cpus` when given, sharing one timing gate unless `config.gate` is off."""
    count = local_workers(config.workers, config.threads, config.measure_cpus, config.gate)
    gate = TimingGate() if config.gate else None
    runners = [
        Runner(config.timeout_s, config.mem_limit_mb, gate=gate, cpus=config.measure_cpus)
        for _ in range(count)
    ]
    measurers = [lambda task, r=runner: measure_task(r, task, config) for runner in runners]
    return Backend(
        measurers, lambda: [r.close() for r in runners], lambda: [r.abort() for r in runners]
    )


def import_ray():
    """The ray module, or an error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendError(
            "the ray backend needs Ray, which is not installed: pip install 'mlirrl-jax[cluster]'"
            " (or pip install ray)"
        ) from None
    return ray


def ray_backend(config: CollectConfig) -> Backend:
    """Ray actors, each holding a Runner (its own measurement worker) on a cluster node."""
    ray = import_ray()

    @ray.remote(num_cpus=1)
    class MeasureActor:
        def __init__(self):
            self.runner = Runner(config.timeout_s, config.mem_limit_mb)

        def measure(self, task: Task) -> Measurement:
            return measure_task(self.runner, task, config)

    ray.init(address=config.address, ignore_reinit_error=True, log_to_driver=False)
    actors = [MeasureActor.remote() for _ in range(config.workers)]
    measurers = [lambda task, a=actor: ray.get(a.measure.remote(task)) for actor in actors]
    return Backend(measurers, ray.shutdown, lambda: [ray.kill(a) for a in actors])
