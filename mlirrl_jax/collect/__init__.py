"""The data-collection job: sample schedules, measure them for real, keep them in the store.

Work is spread round-robin over the suite's programs; each program's baseline (the empty
schedule) comes first, and the baselines of the held-out split are measured too. Schedules the
store already has are skipped, so rerunning the same command resumes the job: the episodes are
drawn from a fixed seed and fast-forward past what is stored. Measurements run in local worker
processes (threads each driving a `Runner`) or on a Ray cluster; results are committed in small
transactions.

Jobs on one store share the work: each task is claimed in the store before it is measured, and a
task another live job has claimed or stored is skipped, so two jobs (of the same seed too) never
measure one schedule twice; a job's budget counts the rows the others store. Timings taken while
another job measures on the same machine contend for its cores, so a job warns of the other.
"""

from mlirrl_jax.collect.backends import Backend, check_measure_cpus, local_workers
from mlirrl_jax.collect.config import (
    BACKENDS,
    COMMIT_EVERY_S,
    SOURCES,
    BackendError,
    CollectConfig,
    CollectReport,
    Task,
    parse_mix,
)
from mlirrl_jax.collect.job import CollectionJob, SpreadChooser
from mlirrl_jax.collect.stream import measure_stream

__all__ = [
    "BACKENDS",
    "COMMIT_EVERY_S",
    "SOURCES",
    "Backend",
    "BackendError",
    "CollectConfig",
    "CollectReport",
    "CollectionJob",
    "SpreadChooser",
    "Task",
    "check_measure_cpus",
    "local_workers",
    "measure_stream",
    "parse_mix",
]
