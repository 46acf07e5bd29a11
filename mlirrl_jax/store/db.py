"""The measurement store itself: one SQLite file in WAL mode, rows put and read, machines'
profiles, and the claims that let jobs share it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.profile import MachineProfile, known_profiles, this_machine_profile
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.store.exchange import Exchange
from mlirrl_jax.store.rows import (
    StoredRow,
    decoded_row,
    measurement_key,
    merged_rows,
    row_of,
)
from mlirrl_jax.store.schema import (
    CLAIM_MAX_AGE_S,
    COLUMNS,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    STORED,
    ClaimOwner,
    StoreError,
    check_sqlite_file,
    owner_alive,
)


class MeasurementStore(Exchange):
    """Measurements of one or more machines in an SQLite file."""

    def __init__(self, path: str | Path, create: bool = True):
        """Open the store at `path`; `create=False` (readers) refuses a missing file instead of
        starting an empty store, so a mistyped path is not mistaken for one without data."""
        self.path = Path(path).resolve()
        if not self.path.is_file():
            if not create:
                raise StoreError(f"{self.path}: no such measurement store")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        check_sqlite_file(self.path)
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
        self._db.executescript(SCHEMA_SQL)
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
                        (*measurement_key(m), claimed_by.token),
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
                and owner_alive(held["host"], held["pid"])
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
        dead = [token for token, pid in held if not owner_alive(owner.host, pid)]
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
            measurement_key(m),
        ).fetchone()
        row = row_of(m)
        if old is None:
            self._db.execute(
                f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                [row[c] for c in COLUMNS],
            )
            return 1
        merged = merged_rows(dict(old), row)
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
    ) -> StoredRow | None:
        """The row of one key, typed; None where there is none."""
        row = self._db.execute(
            "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
            (program_hash, schedule_hash, machine_id, threads),
        ).fetchone()
        return StoredRow.of(row) if row else None

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
            yield decoded_row(row)

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
