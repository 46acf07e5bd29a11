"""Measurements streamed into the store: tasks claimed, measured on a backend, committed in
small transactions (`measure_stream`), with a warning when another job measures on this machine."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait

from tqdm import tqdm

from mlirrl_jax.collect.backends import local_backend, ray_backend
from mlirrl_jax.collect.config import COMMIT_EVERY_S, CollectConfig, CollectReport, Task
from mlirrl_jax.interrupt import check_stop
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.store import ClaimOwner, MeasurementStore

log = logging.getLogger(__name__)


def measure_stream(
    tasks: Iterator[Task],
    config: CollectConfig,
    store: MeasurementStore,
    report: CollectReport,
    bar: tqdm | None = None,
    done: Callable[[], bool] = lambda: False,
    on_result: Callable[[Task, Measurement], None] = lambda task, measurement: None,
    on_skip: Callable[[Task, str], None] = lambda task, reason: None,
) -> CollectReport:
    """Measure `tasks` on the config's backend, `2 x workers` in flight, until they run out or
    `done()`; results go to `store` in a transaction every `COMMIT_EVERY_S` (a kill loses at
    most those in flight and uncommitted) and to `on_result`; tallies go to `report`. On
    Ctrl-C the results in hand are committed and the measurements in flight are killed.

    Each task is claimed in the store before it is measured; one that another job has claimed
    or stored meanwhile goes to `on_skip` with the reason instead. Claims are released as the
    results are stored and when the stream ends."""
    owner = ClaimOwner.here()
    machine = machine_fingerprint()["machine_id"]
    warned: set[int] = set()

    def warn_of_other_jobs() -> None:
        for pid in sorted(store.other_claimants(owner) - warned):
            warned.add(pid)
            log.warning(
                "warning: another job (pid %d) is measuring into %s on this machine too; "
                "timings taken meanwhile contend for its cores",
                pid,
                store.path,
            )

    warn_of_other_jobs()
    backend = ray_backend(config) if config.backend == "ray" else local_backend(config)
    pending: dict[Future, Task] = {}
    buffer: list[Measurement] = []
    last_commit = time.monotonic()

    def commit() -> None:
        nonlocal last_commit
        if buffer:
            report.new_rows += store.put(buffer, claimed_by=owner)
            buffer.clear()
        last_commit = time.monotonic()
        warn_of_other_jobs()

    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2 * config.workers and not done():
                task = next(tasks, None)
                check_stop()  # drawing a task may have built the sampler (start-up)
                if task is None:
                    exhausted = True
                    break
                key = (task.program.hash, task.schedule.hash, machine, config.threads)
                refused = store.claim(*key, owner)
                if refused is not None:
                    report.skipped += 1
                    on_skip(task, refused)
                    continue
                pending[backend.submit(task)] = task
            if not pending:
                break
            finished, _ = wait(list(pending), timeout=1.0, return_when=FIRST_COMPLETED)
            check_stop()
            for future in finished:
                task = pending.pop(future)
                measurement = future.result()
                buffer.append(measurement)
                report.measured += 1
                report.by_status[measurement.status] = (
                    report.by_status.get(measurement.status, 0) + 1
                )
                if not measurement.ok:
                    report.failures += 1
                on_result(task, measurement)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(failures=report.failures, refresh=False)
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                commit()
            if done() and not pending:
                break
    except KeyboardInterrupt:
        backend.abort()
        raise
    finally:
        try:
            commit()
        finally:
            store.release(owner)
            backend.close()
    return report
