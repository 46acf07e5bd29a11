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

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from mlirrl_jax.actions import ACTION_SPACE_VERSION
from mlirrl_jax.errors import Error
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.profile import MachineProfile, known_profiles, this_machine_profile
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.schedule import Schedule

# 2: origins (idempotent imports), claims (jobs sharing a store); 3: machines (profiles)
SCHEMA_VERSION = 3
PROFILES_KEY = b"mlirrl_jax.machines"  # Parquet schema metadata: the rows' machines' profiles
MAX_SAMPLES = 16  # per-measurement medians kept per row
# a claim this old is taken over whoever holds it: a measurement lasts minutes at most, and the
# owner of a claim made on another host cannot be checked for life
CLAIM_MAX_AGE_S = 3600.0
STORED = "stored"  # why a claim is refused: the task's row is in the store

_SCHEMA = """
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


class MeasurementStore:
    """Measurements of one or more machines in an SQLite file."""

    def __init__(self, path: str | Path, create: bool = True):
        """Open the store at `path`; `create=False` (readers) refuses a missing file instead of
        starting an empty store, so a mistyped path is not mistaken for one without data."""
        self.path = Path(path).resolve()
        if not self.path.is_file():
            if not create:
                raise StoreError(f"{self.path}: no such measurement store")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        _check_sqlite_file(self.path)
        # mode=rw: a reader's store that vanished since the check above is not created either
        where = self.path if create else f"{self.path.as_uri()}?mode=rw"
        db = None
        try:
            db = sqlite3.connect(where, timeout=60, isolation_level=None, uri=not create)
            self._db = db
            self._prepare(create)
        except BaseException as exc:
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(f"{self.path}: not a readable measurement store ({exc})") from None
            raise

    def _prepare(self, create: bool) -> None:
        """Settings, the schema (created if missing and `create`), its version checked."""
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "PRAGMA synchronous=NORMAL"
        )  # WAL + NORMAL: a killed process loses nothing committed
        self._db.execute("PRAGMA foreign_keys=ON")
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
        if not create and not {"meta", "programs", "measurements"} <= tables:
            raise StoreError(f"{self.path}: holds no measurement store tables")
        self._db.executescript(_SCHEMA)
        version = self._meta("schema_version")
        if version is None or int(version) < SCHEMA_VERSION:
            with self._transaction():
                self._upgrade()
        elif int(version) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version}, this code reads {SCHEMA_VERSION}; "
                "update mlirrl-jax to open it"
            )
        self.store_id: str = self._meta("store_id")

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _upgrade(self) -> None:
        """Bring a new or older store to SCHEMA_VERSION, inside a transaction."""
        version = self._meta("schema_version")  # again: another process may have upgraded it
        if version is not None and int(version) >= SCHEMA_VERSION:
            return
        # from version 1 nothing moves: its rows record no origins, so all their measurements
        # are their own lineage's, as an export of schema 1 says of them too. From version 2,
        # the machines of its rows get the profiles known without measuring (shipped, or this
        # machine's cached one); this machine's is recorded at its next `put` otherwise
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        self._db.execute(
            "INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex[:16],)
        )
        self._record_profiles(self._profiles_of(self.machines()))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> MeasurementStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing
    def add_programs(self, programs: Iterable[Program]) -> None:
        with self._transaction():
            self._db.executemany(
                "INSERT OR IGNORE INTO programs VALUES (?, ?, ?, ?, ?)",
                [(p.hash, p.name, p.mlir, p.flops, time.time()) for p in programs],
            )

    def put(self, measurements: Iterable[Measurement], claimed_by: ClaimOwner | None = None) -> int:
        """Store measurements in one transaction, releasing `claimed_by`'s claims on them;
        returns how many rows were new. The profile of a machine the store has no record of
        is recorded with its first rows: this machine's (measured once if not yet cached,
        `measure.profile`) or a known machine's."""
        measurements = list(measurements)
        profiles = self._profiles_to_record(
            {m.fingerprint["machine"]["machine_id"] for m in measurements}
        )
        new = 0
        with self._transaction():
            self._record_profiles(profiles)
            for m in measurements:
                new += self._upsert(m)
                if claimed_by is not None:
                    self._db.execute(
                        "DELETE FROM claims WHERE program_hash=? AND schedule_hash=? "
                        "AND machine_id=? AND threads=? AND owner=?",
                        (*_key(m), claimed_by.token),
                    )
        return new

    # -- machines: the profile of each machine whose rows the store holds
    def record_machine(self, profile: MachineProfile) -> bool:
        """Record a machine's profile unless the store has one already (a machine's profile
        never changes once recorded: its features stay the same); returns whether it did."""
        with self._transaction():
            return bool(self._record_profiles([profile]))

    def machine_profiles(self) -> dict[str, MachineProfile]:
        """The recorded profiles, by machine id."""
        return {
            r["machine_id"]: MachineProfile.from_json(json.loads(r["profile"]))
            for r in self._db.execute("SELECT machine_id, profile FROM machines")
        }

    def _record_profiles(self, profiles: Iterable[MachineProfile]) -> int:
        """Inside a transaction: record the profiles of machines without one; how many."""
        added = 0
        for p in profiles:
            added += self._db.execute(
                "INSERT OR IGNORE INTO machines VALUES (?, ?, ?)",
                (p.machine_id, json.dumps(p.to_json(), sort_keys=True), time.time()),
            ).rowcount
        return added

    def _profiles_of(self, machine_ids: set[str]) -> list[MachineProfile]:
        """The profiles of these machines that the store records or that are known without
        measuring (shipped, or this machine's cached one), by id."""
        known = {**known_profiles(), **self.machine_profiles()}
        here = this_machine_profile(measure=False)
        if here is not None:
            known.setdefault(here.machine_id, here)
        return [known[m] for m in sorted(machine_ids) if m in known]

    def _profiles_to_record(self, machine_ids: set[str]) -> list[MachineProfile]:
        """Profiles of these machines that the store lacks and that are known: this machine's
        (measured if not cached) and the shipped ones."""
        recorded = {r[0] for r in self._db.execute("SELECT machine_id FROM machines").fetchall()}
        here = machine_fingerprint()["machine_id"]
        found = []
        for machine_id in sorted(machine_ids - recorded):
            if machine_id == here:
                found.append(this_machine_profile())
            elif machine_id in known_profiles():
                found.append(known_profiles()[machine_id])
        return found

    # -- claims: jobs measuring into one store share the work
    def claim(
        self,
        program_hash: str,
        schedule_hash: str,
        machine_id: str,
        threads: int,
        owner: ClaimOwner,
    ) -> str | None:
        """Claim a task for `owner`: None when it is theirs now, else why not (`STORED`, or
        held by another live job). Claims of dead owners or older than CLAIM_MAX_AGE_S are
        taken over."""
        key = (program_hash, schedule_hash, machine_id, threads)
        where = "program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?"
        with self._transaction():
            if self._db.execute(f"SELECT 1 FROM measurements WHERE {where}", key).fetchone():
                return STORED
            held = self._db.execute(f"SELECT * FROM claims WHERE {where}", key).fetchone()
            if (
                held is not None
                and held["owner"] != owner.token
                and time.time() - held["claimed_at"] < CLAIM_MAX_AGE_S
                and _alive(held["host"], held["pid"])
            ):
                return f"claimed by pid {held['pid']} on {held['host']}"
            self._db.execute(
                "INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, owner.token, owner.host, owner.pid, time.time()),
            )
        return None

    def claimed(self, machine_id: str, threads: int = 1) -> list[tuple[str, str]]:
        """(program hash, schedule hash) of the tasks of a machine and thread count that jobs
        hold claims on."""
        rows = self._db.execute(
            "SELECT program_hash, schedule_hash FROM claims WHERE machine_id=? AND threads=?",
            (machine_id, threads),
        )
        return [tuple(r) for r in rows]

    def release(self, owner: ClaimOwner) -> None:
        """Drop every claim of `owner` (its job ends)."""
        with self._transaction():
            self._db.execute("DELETE FROM claims WHERE owner=?", (owner.token,))

    def other_claimants(self, owner: ClaimOwner) -> set[int]:
        """Pids of the other live jobs on this host that hold claims here; the claims of dead
        ones are dropped."""
        held = self._db.execute(
            "SELECT DISTINCT owner, pid FROM claims WHERE host=? AND owner!=?",
            (owner.host, owner.token),
        ).fetchall()
        dead = [token for token, pid in held if not _alive(owner.host, pid)]
        if dead:
            with self._transaction():
                self._db.executemany("DELETE FROM claims WHERE owner=?", [(t,) for t in dead])
        return {pid for token, pid in held if token not in dead}

    def _upsert(self, m: Measurement) -> int:
        if not self._db.execute(
            "SELECT 1 FROM programs WHERE program_hash=?", (m.program_hash,)
        ).fetchone():
            raise StoreError(
                f"program {m.program} ({m.program_hash[:12]}) is not in the store; add_programs first"
            )
        old = self._db.execute(
            "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
            _key(m),
        ).fetchone()
        row = _row_of(m)
        if old is None:
            self._db.execute(
                f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                [row[c] for c in COLUMNS],
            )
            return 1
        merged = _merge(dict(old), row)
        self._db.execute(
            f"UPDATE measurements SET {', '.join(f'{c}=?' for c in COLUMNS)} WHERE id=?",
            [merged[c] for c in COLUMNS] + [old["id"]],
        )
        return 0

    @contextlib.contextmanager
    def _transaction(self):
        try:  # BEGIN inside: a Ctrl-C just after it must not leave the transaction open
            self._db.execute("BEGIN IMMEDIATE")
            yield
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- reading
    def get(
        self, program_hash: str, schedule_hash: str, machine_id: str, threads: int = 1
    ) -> dict | None:
        row = self._db.execute(
            "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
            (program_hash, schedule_hash, machine_id, threads),
        ).fetchone()
        return _decoded(row) if row else None

    def rows(
        self,
        machine_id: str | None = None,
        status: str | None = None,
        program_hash: str | None = None,
    ) -> Iterator[dict]:
        """Measurement rows, optionally filtered; JSON columns decoded."""
        clauses, args = [], []
        for column, value in (
            ("machine_id", machine_id),
            ("status", status),
            ("program_hash", program_hash),
        ):
            if value is not None:
                clauses.append(f"{column}=?")
                args.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        for row in self._db.execute(f"SELECT * FROM measurements{where} ORDER BY id", args):
            yield _decoded(row)

    def keys_since(
        self, row_id: int, machine_id: str, threads: int = 1
    ) -> list[tuple[int, str, str]]:
        """(id, program hash, schedule hash) of the rows of a machine and thread count added
        after row `row_id` (0: all), by id: a job follows what other jobs store."""
        rows = self._db.execute(
            "SELECT id, program_hash, schedule_hash FROM measurements "
            "WHERE id>? AND machine_id=? AND threads=? ORDER BY id",
            (row_id, machine_id, threads),
        )
        return [tuple(r) for r in rows]

    def count(self, machine_id: str | None = None, status: str | None = None) -> int:
        clauses, args = [], []
        for column, value in (("machine_id", machine_id), ("status", status)):
            if value is not None:
                clauses.append(f"{column}=?")
                args.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._db.execute(f"SELECT COUNT(*) FROM measurements{where}", args).fetchone()[0]

    def machines(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT DISTINCT machine_id FROM measurements")}

    def program(self, program_hash: str) -> Program:
        row = self._db.execute(
            "SELECT name, mlir FROM programs WHERE program_hash=?", (program_hash,)
        ).fetchone()
        if row is None:
            raise StoreError(f"program {program_hash[:12]} is not in the store")
        return parse_program(row["mlir"], row["name"])

    def summary(self) -> dict:
        by_status = dict(
            self._db.execute("SELECT status, COUNT(*) FROM measurements GROUP BY status").fetchall()
        )
        return {
            "path": str(self.path),
            "programs": self._db.execute(
                "SELECT COUNT(DISTINCT program_hash) FROM measurements"
            ).fetchone()[0],
            "measurements": sum(by_status.values()),
            "by_status": by_status,
            "machines": sorted(self.machines()),
        }

    def card(self, machine_id: str, title: str, command: str) -> str:
        """A data card (Markdown) for one machine's measurements."""
        rows = list(self.rows(machine_id=machine_id))
        if not rows:
            raise StoreError(f"no measurements of machine {machine_id}")
        fingerprint = rows[-1]["fingerprint"]
        machine, toolchain = fingerprint["machine"], fingerprint["toolchain"]
        verified = [r for r in rows if r["status"] == "ok"]
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        baselines = sum(1 for r in verified if r["schedule"] == {"format": 1, "ops": []})
        programs = {r["program_hash"] for r in verified}
        sampled = {r["program_hash"] for r in verified if r["schedule"]["ops"]}
        methods = {json.dumps(r["method"], sort_keys=True) for r in rows}
        first, last = min(r["created_at"] for r in rows), max(r["updated_at"] for r in rows)
        counts: dict[int, int] = {}
        for r in verified:
            counts[r["threads"]] = counts.get(r["threads"], 0) + 1
        by_threads = ", ".join(f"{t}: {n} verified rows" for t, n in sorted(counts.items()))
        recorded = self.machine_profiles().get(machine_id)
        profile = (
            "not recorded"
            if recorded is None
            else ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in recorded.to_json().items()
                if k not in ("machine_id", "sources")
            )
        )
        day = lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))  # noqa: E731
        return "\n".join(
            [
                f"# {title}",
                "",
                f"Measurements of machine `{machine_id}`; times are only comparable on this machine.",
                "",
                "| | |",
                "|---|---|",
                f"| CPU | {machine['cpu_model']} ({machine['arch']}, {machine['cores']} cores) |",
                f"| ISA flags | {', '.join(machine['isa_flags'])} |",
                f"| caches | {', '.join(f'{k} {v}' for k, v in machine['caches'].items())} |",
                f"| toolchain | {', '.join(f'{k} {v}' for k, v in toolchain.items() if k != 'toolchain_id')} |",
                f"| collected | {day(first)} to {day(last)} UTC |",
                f"| rows | {len(rows)}: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))} |",
                f"| verified | {len(verified)} over {len(programs)} programs; {baselines} baselines; "
                f"sampled schedules on {len(sampled)} programs |",
                f"| threads per kernel | {by_threads} |",
                f"| action space | version {ACTION_SPACE_VERSION} (of the code that wrote this card; "
                "rows measured earlier may use a subset of it) |",
                f"| machine profile | {profile} |",
                f"| timing method | {'; '.join(sorted(methods))} |",
                "",
                f"Collected with: `{command}`",
                "",
                "Each row: program (hash, name, MLIR in the programs table), schedule (JSON, hash),",
                "machine and toolchain fingerprint, timing method, median / min / spread of the run time,",
                "whether the output matched the NumPy reference, the failure reason if any, timestamps.",
                "Failures are kept as data: crash, timeout, oom, wrong_output, compile_error.",
                "",
                "Use: `mlirrl-jax store import <this parquet> --store data/measurements.db`, then",
                "`mlirrl-jax fit-cost-model --store data/measurements.db`. On another machine,",
                "collect that machine's own data: times do not transfer.",
                "",
            ]
        )

    # -- exchange
    def export_parquet(self, path: str | Path, machine_id: str | None = None) -> int:
        """Write measurements (and their programs) to a Parquet file; returns the row count.

        Compact, for shipped seeds: rows grouped by program, floats byte-stream split, zstd at
        its strongest level; `schedule_hash` is left out, as `Schedule.loads(schedule).hash`
        gives it back (`import_parquet` does so), and it is the one incompressible column.
        `provenance` holds each row's shares by origin but its lineage's (`Share`), so that
        importing the file again, or a later export, adds only what is new. The schema's
        metadata (`PROFILES_KEY`) holds the profiles of the rows' machines."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        recorded: dict[int, dict[str, Share]] = {}
        for o in self._db.execute("SELECT * FROM origins"):
            recorded.setdefault(o["measurement_id"], {})[o["origin"]] = _share(o)
        rows = list(
            self._db.execute(
                "SELECT m.*, p.mlir AS program_mlir, p.flops AS program_flops FROM measurements m "
                "JOIN programs p USING (program_hash)"
                + (" WHERE m.machine_id=?" if machine_id else "")
                + " ORDER BY m.program_hash, m.id",
                (machine_id,) if machine_id else (),
            )
        )
        names = [c for c in (*COLUMNS, "program_mlir", "program_flops") if c != "schedule_hash"]
        columns = {n: [r[n] for r in rows] for n in names}
        columns["provenance"] = [
            _provenance(r, self._shares(r, recorded.get(r["id"], {}))) for r in rows
        ]
        table = pa.table(columns)
        profiles = self._profiles_of(set(columns["machine_id"]))
        table = table.replace_schema_metadata(
            {PROFILES_KEY: json.dumps([p.to_json() for p in profiles], sort_keys=True)}
        )
        floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
        pq.write_table(
            table,
            str(path),
            compression="zstd",
            compression_level=19,
            use_dictionary=[n for n in columns if n not in floats],
            use_byte_stream_split=floats,
        )
        from mlirrl_jax import integrity

        integrity.seal_file(path)  # its sidecar checksum, which `import_parquet` checks
        return len(rows)

    def import_parquet(
        self,
        path: str | Path,
        allow_other_machines: bool = False,
        this_machine: str | None = None,
    ) -> ImportReport:
        """Merge a Parquet export in, each measurement once however often it comes.

        Rows of this machine (`this_machine`, by default the fingerprint of the one running)
        always come in. Rows of any other machine come in only with `allow_other_machines`,
        whatever the store already holds, and then sit beside this machine's rows under their
        own machine id: nothing reads them unless asked for that machine by name.

        The machines' profiles come with the rows: the file's (`export_parquet`), else known
        ones; a profile the store has recorded stays as it is.

        A row brings only what its origins have beyond what the store holds of them, their
        newest samples. The limit: a store of schema 1 recorded no origins, so the rows it
        merged from an import count as its own (again, beside the file they came from), and
        those it copied whole share their origin's lineage with what it measured after.
        """
        import pyarrow.parquet as pq

        from mlirrl_jax import integrity

        integrity.verify_file(path, "export it again (`mlirrl-jax store export`)")
        read = pq.read_table(str(path))
        records = read.to_pylist()
        given_profiles = {
            p["machine_id"]: MachineProfile.from_json(p)
            for p in json.loads((read.schema.metadata or {}).get(PROFILES_KEY, b"[]"))
        }
        for r in records:  # compact exports leave the derivable schedule hash out
            if r.get("schedule_hash") is None:
                r["schedule_hash"] = Schedule.loads(r["schedule"]).hash
        this_machine = this_machine or machine_fingerprint()["machine_id"]
        others = sorted({r["machine_id"] for r in records} - {this_machine})
        if others and not allow_other_machines:
            counts = {m: sum(r["machine_id"] == m for r in records) for m in others}
            raise StoreError(
                f"{path} holds {sum(counts.values())} measurements of other machine(s) "
                f"{', '.join(f'{m} ({n} rows)' for m, n in counts.items())}; this machine is "
                f"{this_machine}. Times from different machines do not mix silently: import "
                "them with `store import --allow-other-machines` (allow_other_machines=True "
                "from Python) to keep them beside this machine's rows, under their own id"
            )
        report = ImportReport()
        imported = {r["machine_id"] for r in records}
        # the file's profiles; a machine it gives none of (an export of schema 2) gets a known
        # one, if any
        profiles = [given_profiles[m] for m in sorted(imported & set(given_profiles))]
        profiles += self._profiles_to_record(imported - set(given_profiles))
        with self._transaction():
            self._record_profiles(profiles)
            for r in records:
                self._db.execute(
                    "INSERT OR IGNORE INTO programs VALUES (?, ?, ?, ?, ?)",
                    (
                        r["program_hash"],
                        r["program_name"],
                        r["program_mlir"],
                        r["program_flops"],
                        r["created_at"],
                    ),
                )
                old = self._db.execute(
                    "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
                    (r["program_hash"], r["schedule_hash"], r["machine_id"], r["threads"]),
                ).fetchone()
                recorded = {} if old is None else self._recorded(old["id"])
                # a row born elsewhere holds this store's own measurements under its id
                own = self.store_id if old is None else self._own_origin(old, recorded)
                held = {} if old is None else self._shares(old, recorded)
                given = _exported_shares(r)
                if old is None:  # its lineage is recorded, even empty: the row was born there
                    given.setdefault(_lineage(r), Share(0, 0, []))
                # what each origin has beyond what this store holds of it: a file imported
                # again adds nothing, a later export of the same store only its newer part
                measured = failed = 0
                samples: list[float] = []
                for origin, share in given.items():
                    had = held.get(origin, Share(0, 0, []))
                    more = share.measured - had.measured
                    if more > 0:
                        more_failed = max(0, share.failed - had.failed)
                        measured, failed = measured + more, failed + more_failed
                        verified = more - more_failed  # an origin's newest samples are new
                        samples += share.samples[-verified:] if verified > 0 else []
                if measured == 0:
                    report.skipped += 1
                    continue
                contribution = {c: r[c] for c in COLUMNS}
                contribution.update(
                    n_measured=measured, n_failed=failed, samples=json.dumps(samples[-MAX_SAMPLES:])
                )
                if old is None:
                    row_id = self._db.execute(
                        f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                        [contribution[c] for c in COLUMNS],
                    ).lastrowid
                    report.new += 1
                else:
                    merged = _merge(dict(old), contribution)
                    self._db.execute(
                        f"UPDATE measurements SET {', '.join(f'{c}=?' for c in COLUMNS)} WHERE id=?",
                        [merged[c] for c in COLUMNS] + [old["id"]],
                    )
                    row_id = old["id"]
                    report.merged += 1
                self._db.executemany(  # the newer shares; this store's own is never recorded
                    "INSERT OR REPLACE INTO origins VALUES (?, ?, ?, ?, ?)",
                    [
                        (row_id, o, share.measured, share.failed, json.dumps(share.samples))
                        for o, share in given.items()
                        if o != own and (o not in held or share.measured > held[o].measured)
                    ],
                )
        return report

    def _recorded(self, row_id: int) -> dict[str, Share]:
        """The shares imports brought a stored row, by origin."""
        return {
            o["origin"]: _share(o)
            for o in self._db.execute("SELECT * FROM origins WHERE measurement_id=?", (row_id,))
        }

    def _shares(self, row, recorded: dict[str, Share]) -> dict[str, Share]:
        """A stored row's shares by origin: those imports `recorded`, and its own."""
        return {**recorded, self._own_origin(row, recorded): _rest(row, recorded)}

    def _own_origin(self, row, recorded: dict[str, Share]) -> str:
        """The origin a stored row's own measurements (taken here) are credited to: the row's
        lineage if it was born here, else this store's id (an import recorded the lineage)."""
        lineage = _lineage(row)
        return self.store_id if lineage in recorded else lineage


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path) -> None:
    """Refuse a file that is not SQLite, or is shorter than its header says (a truncated copy):
    SQLite itself would open either and fail later, on the first page it cannot read."""
    size = path.stat().st_size if path.is_file() else 0
    if size == 0:  # a new store
        return
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
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


def _alive(host: str, pid: int) -> bool:
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


def _key(m: Measurement) -> tuple[str, str, str, int]:
    """A measurement's row key: (program hash, schedule hash, machine id, threads)."""
    return (m.program_hash, m.schedule_hash, m.fingerprint["machine"]["machine_id"], m.threads)


def _lineage(row) -> str:
    """The origin of the measurements of the row where they were first taken: its key and the
    time of its first measurement (exact, as repr), which every later version and copy keeps."""
    text = f"{row['machine_id']} {row['program_hash']} {row['schedule_hash']} {row['threads']}"
    return "row:" + hashlib.sha256(f"{text} {row['created_at']!r}".encode()).hexdigest()[:16]


def _share(origin: sqlite3.Row) -> Share:
    return Share(origin["n_measured"], origin["n_failed"], json.loads(origin["samples"]))


def _rest(row, shares: dict[str, Share]) -> Share:
    """What a row holds beyond `shares`: its counts less theirs, its samples less theirs."""
    samples = json.loads(row["samples"])
    for share in shares.values():
        for sample in share.samples:
            if sample in samples:  # a wrong output or another runtime dropped the row's times
                samples.remove(sample)
    return Share(
        row["n_measured"] - sum(s.measured for s in shares.values()),
        row["n_failed"] - sum(s.failed for s in shares.values()),
        samples,
    )


def _provenance(row, shares: dict[str, Share]) -> str:
    """An exported row's shares by origin (JSON), but its lineage's: an importer credits the
    lineage with the rest (`_exported_shares`), as it does a row exported without them."""
    lineage = _lineage(row)
    listed = {o: list(s) for o, s in shares.items() if s.measured > 0 and o != lineage}
    return json.dumps(listed, sort_keys=True, separators=(",", ":"))


def _exported_shares(record: dict) -> dict[str, Share]:
    """An exported row's shares by origin: those its provenance lists, and the rest its own
    lineage's (all of it, from a file of schema 1)."""
    listed = {o: Share(*s) for o, s in json.loads(record.get("provenance") or "{}").items()}
    rest = _rest(record, listed)
    return {**listed, _lineage(record): rest} if rest.measured > 0 else listed


def _row_of(m: Measurement) -> dict:
    ok = m.status == "ok"
    now = time.time()
    return {
        "program_hash": m.program_hash,
        "program_name": m.program,
        "schedule_hash": m.schedule_hash,
        "schedule": json.dumps(m.schedule, sort_keys=True),
        "machine_id": m.fingerprint["machine"]["machine_id"],
        "toolchain_id": m.fingerprint["toolchain"]["toolchain_id"],
        "fingerprint": json.dumps(m.fingerprint, sort_keys=True),
        "threads": m.threads,
        "runtime": m.runtime,
        "method": json.dumps(m.method, sort_keys=True),
        "status": m.status,
        "verified": int(ok and m.verified),
        "median_s": m.median_s if ok else None,
        "min_s": m.min_s if ok else None,
        "spread": m.spread if ok else None,
        "samples": json.dumps([m.median_s] if ok else []),
        "n_measured": 1,
        "n_failed": 0 if ok else 1,
        "max_error": m.max_error,
        "error": m.error,
        "compile_s": sum(m.compile_s.values()) if m.compile_s else None,
        "created_at": m.created_at,
        "updated_at": now,
    }


def _merge(old: dict, new: dict) -> dict:
    """Combine a row with a new measurement of the same (program, schedule, machine, threads).

    Verified times accumulate (median of per-measurement medians, overall minimum); a
    measurement under another parallel runtime (OpenMP against MLIR's async runtime) is other
    code, so its times replace the row's. A wrong output anywhere makes the row a wrong output
    and drops its times: such a schedule is not trusted. A crash or timeout after verified runs is counted, the times are kept.
    """
    merged = dict(old)
    merged["n_measured"] = old["n_measured"] + new["n_measured"]
    merged["n_failed"] = old["n_failed"] + new["n_failed"]
    merged["updated_at"] = new["updated_at"]
    merged["toolchain_id"], merged["fingerprint"] = new["toolchain_id"], new["fingerprint"]
    if "wrong_output" in (old["status"], new["status"]):
        merged.update(
            status="wrong_output",
            verified=0,
            median_s=None,
            min_s=None,
            spread=None,
            samples="[]",
            error=new["error"] if new["status"] == "wrong_output" else old["error"],
        )
        return merged
    if new["status"] != "ok":
        if old["status"] != "ok":
            merged.update(status=new["status"], error=new["error"])
        return merged
    if new["samples"] == "[]":  # an import's newer part that holds failures only: counted
        return merged
    earlier = json.loads(old["samples"])
    if old["runtime"] != new["runtime"]:  # other parallel code: the new times replace them
        earlier = []
        merged.update(runtime=new["runtime"], min_s=None)
    samples = (earlier + json.loads(new["samples"]))[-MAX_SAMPLES:]
    merged.update(
        status="ok",
        verified=1,
        error=None,
        samples=json.dumps(samples),
        median_s=statistics.median(samples),
        min_s=min(v for v in (merged["min_s"], new["min_s"]) if v is not None),
        spread=new["spread"],
        max_error=new["max_error"],
        method=new["method"],
    )
    return merged


def _decoded(row: sqlite3.Row) -> dict:
    out = dict(row)
    for column in ("schedule", "fingerprint", "method", "samples"):
        out[column] = json.loads(out[column])
    out["verified"] = bool(out["verified"])
    return out
