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

from mlirrl_jax.util.lazy import lazy_exports

# each name from its module at first use: `collect.config` loads without JAX
_EXPORTS = {
    "BACKENDS": "mlirrl_jax.collect.config",
    "COMMIT_EVERY_S": "mlirrl_jax.collect.config",
    "SOURCES": "mlirrl_jax.collect.config",
    "BackendError": "mlirrl_jax.collect.config",
    "CollectConfig": "mlirrl_jax.collect.config",
    "CollectReport": "mlirrl_jax.collect.config",
    "Task": "mlirrl_jax.collect.config",
    "parse_mix": "mlirrl_jax.collect.config",
    "Backend": "mlirrl_jax.collect.backends",
    "check_measure_cpus": "mlirrl_jax.collect.backends",
    "CollectionJob": "mlirrl_jax.collect.job",
    "local_workers": "mlirrl_jax.collect.backends",
    "measure_stream": "mlirrl_jax.collect.stream",
    "SpreadChooser": "mlirrl_jax.collect.job",
}
__all__ = sorted(
    [
        *_EXPORTS,
        "BACKENDS",
        "BackendError",
        "COMMIT_EVERY_S",
        "CollectConfig",
        "CollectReport",
        "SOURCES",
        "Task",
        "parse_mix",
    ]
)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
