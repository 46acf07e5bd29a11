"""The measurement store: real measurements in one SQLite file (WAL mode), Parquet exchange.

One row per (program, schedule, machine, threads). Measuring the same thing again updates that
row's statistics and never adds a row. Writes are transactions, so a kill at any moment loses
at most the measurements in flight. A row is a verified time or a failure with its reason: a
wrong output never leaves a time behind. Programs are stored with their MLIR, so a dataset is
self-contained, and so are the machines: the store records the profile of each machine whose
rows it holds (`measure.profile`), and an export carries them.

Imports are idempotent. A row records the share of its measurements that came from each origin
(the row where they were first taken, named by its lineage, or a store, by the id it draws at
creation), and an export carries the record: a row comes in only with what its origins have
beyond what the store holds of them, so importing a file twice, or an export and a later, larger
export of the same store, or a copy that another store merged and measured further, counts every
measurement once.

Jobs measuring into one store share the work through claims: a job claims a task before
measuring it, and a task stored or claimed by another live job is not measured again.
"""

from mlirrl_jax.store.db import MeasurementStore
from mlirrl_jax.store.schema import (
    CLAIM_MAX_AGE_S,
    COLUMNS,
    MAX_SAMPLES,
    PROFILES_KEY,
    SCHEMA_VERSION,
    STORED,
    ClaimOwner,
    ImportReport,
    Share,
    StoreError,
)

__all__ = [
    "CLAIM_MAX_AGE_S",
    "COLUMNS",
    "MAX_SAMPLES",
    "PROFILES_KEY",
    "SCHEMA_VERSION",
    "STORED",
    "ClaimOwner",
    "ImportReport",
    "MeasurementStore",
    "Share",
    "StoreError",
]
