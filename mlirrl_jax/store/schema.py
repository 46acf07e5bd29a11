"""The store's SQLite schema and version, its row columns, and the small types its API speaks
(`StoreError`, `ImportReport`, `Share`, `ClaimOwner`)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from mlirrl_jax.errors import Error

# 2: origins (idempotent imports), claims (jobs sharing a store); 3: machines (profiles)
SCHEMA_VERSION = 3
PROFILES_KEY = b"mlirrl_jax.machines"  # Parquet schema metadata: the rows' machines' profiles
MAX_SAMPLES = 16  # per-measurement medians kept per row
# a claim this old is taken over whoever holds it: a measurement lasts minutes at most, and the
# owner of a claim made on another host cannot be checked for life
CLAIM_MAX_AGE_S = 3600.0
STORED = "stored"  # why a claim is refused: the task's row is in the store

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS programs (
    program_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    mlir TEXT NOT NULL,
    flops INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    program_hash TEXT NOT NULL REFERENCES programs(program_hash),
    program_name TEXT NOT NULL,
    schedule_hash TEXT NOT NULL,
    schedule TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    toolchain_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    threads INTEGER NOT NULL,
    runtime TEXT NOT NULL,
    method TEXT NOT NULL,
    status TEXT NOT NULL,
    verified INTEGER NOT NULL,
    median_s REAL,
    min_s REAL,
    spread REAL,
    samples TEXT NOT NULL,
    n_measured INTEGER NOT NULL,
    n_failed INTEGER NOT NULL,
    max_error REAL,
    error TEXT,
    compile_s REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (program_hash, schedule_hash, machine_id, threads)
);
CREATE INDEX IF NOT EXISTS measurements_program ON measurements (program_hash, machine_id);
-- the shares of a row's measurements that imports brought, by origin (`Share`)
CREATE TABLE IF NOT EXISTS origins (
    measurement_id INTEGER NOT NULL REFERENCES measurements(id),
    origin TEXT NOT NULL,
    n_measured INTEGER NOT NULL,
    n_failed INTEGER NOT NULL,
    samples TEXT NOT NULL,
    PRIMARY KEY (measurement_id, origin)
);
-- tasks a job is measuring now, by the job's token and the host and pid that keep it alive
CREATE TABLE IF NOT EXISTS claims (
    program_hash TEXT NOT NULL,
    schedule_hash TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    threads INTEGER NOT NULL,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (program_hash, schedule_hash, machine_id, threads)
);
-- the profile (`measure.profile.MachineProfile`, JSON) of each machine whose rows it holds
CREATE TABLE IF NOT EXISTS machines (
    machine_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
"""

COLUMNS = (
    "program_hash",
    "program_name",
    "schedule_hash",
    "schedule",
    "machine_id",
    "toolchain_id",
    "fingerprint",
    "threads",
    "runtime",
    "method",
    "status",
    "verified",
    "median_s",
    "min_s",
    "spread",
    "samples",
    "n_measured",
    "n_failed",
    "max_error",
    "error",
    "compile_s",
    "created_at",
    "updated_at",
)


class StoreError(Error, ValueError):
    """A store operation that would lose or mix data."""


@dataclass
class ImportReport:
    """What an import did with a file's rows."""

    new: int = 0  # rows the store lacked
    merged: int = 0  # rows that added measurements to a stored row
    skipped: int = 0  # rows whose measurements the store holds already (imported before)


class Share(NamedTuple):
    """The measurements of a row that came from one origin."""

    measured: int
    failed: int
    samples: list[float]  # their verified times (per-measurement medians), oldest first


@dataclass(frozen=True)
class ClaimOwner:
    """A job claiming tasks: its own token, and the host and pid whose life keeps claims."""

    token: str
    host: str
    pid: int

    @classmethod
    def here(cls) -> ClaimOwner:
        """A new owner for a job of this process."""
        return cls(uuid.uuid4().hex[:16], socket.gethostname(), os.getpid())


SQLITE_MAGIC = b"SQLite format 3\x00"


def check_sqlite_file(path: Path) -> None:
    """Refuse a file that is not SQLite, or is shorter than its header says (a truncated copy):
    SQLite itself would open either and fail later, on the first page it cannot read."""
    size = path.stat().st_size if path.is_file() else 0
    if size == 0:  # a new store
        return
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path}: not an SQLite file, so not a measurement store")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # the header's page count holds only while its version number matches the change counter
    if header[92:96] == header[24:28] and pages * page_size > size:
        raise StoreError(
            f"{path}: truncated measurement store: {size} bytes, its header says "
            f"{pages * page_size}"
        )


def owner_alive(host: str, pid: int) -> bool:
    """Whether a claim's owner may still run: a pid is only checked on its own host."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
