"""The measurement store: real measurements in one SQLite file (WAL mode), Parquet exchange.

One row per (program, schedule, machine, threads). Measuring the same thing again updates that
row's statistics and never adds a row. Writes are transactions, so a kill at any moment loses
at most the measurements in flight. A row is a verified time or a failure with its reason: a
wrong output never leaves a time behind. Programs are stored with their MLIR, so a dataset is
self-contained.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import statistics
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.programs.ir import Program, parse_program
from mlirrl_jax.schedule import Schedule

SCHEMA_VERSION = 1
MAX_SAMPLES = 16  # per-measurement medians kept per row

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


class StoreError(ValueError):
    """A store operation that would lose or mix data."""


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
        version = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if version is None:
            self._db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        elif int(version[0]) != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version[0]}, this code reads {SCHEMA_VERSION}"
            )

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

    def put(self, measurements: Iterable[Measurement]) -> int:
        """Store measurements in one transaction; returns how many rows were new."""
        new = 0
        with self._transaction():
            for m in measurements:
                new += self._upsert(m)
        return new

    def _upsert(self, m: Measurement) -> int:
        if not self._db.execute(
            "SELECT 1 FROM programs WHERE program_hash=?", (m.program_hash,)
        ).fetchone():
            raise StoreError(
                f"program {m.program} ({m.program_hash[:12]}) is not in the store; add_programs first"
            )
        machine = m.fingerprint["machine"]["machine_id"]
        key = (m.program_hash, m.schedule_hash, machine, m.threads)
        old = self._db.execute(
            "SELECT * FROM measurements WHERE program_hash=? AND schedule_hash=? AND machine_id=? AND threads=?",
            key,
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

    def schedule_hashes(self, program_hash: str, machine_id: str, threads: int = 1) -> set[str]:
        return {
            r[0]
            for r in self._db.execute(
                "SELECT schedule_hash FROM measurements WHERE program_hash=? AND machine_id=? AND threads=?",
                (program_hash, machine_id, threads),
            )
        }

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
        gives it back (`import_parquet` does so), and it is the one incompressible column."""
        import pyarrow as pa
        import pyarrow.parquet as pq

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
        table = pa.table({n: [r[n] for r in rows] for n in names})
        floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
        pq.write_table(
            table,
            str(path),
            compression="zstd",
            compression_level=19,
            use_dictionary=[n for n in names if n not in floats],
            use_byte_stream_split=floats,
        )
        return len(rows)

    def import_parquet(
        self,
        path: str | Path,
        allow_other_machines: bool = False,
        this_machine: str | None = None,
    ) -> int:
        """Merge a Parquet export in.

        Rows of this machine (`this_machine`, by default the fingerprint of the one running)
        always come in. Rows of any other machine come in only with `allow_other_machines`,
        whatever the store already holds, and then sit beside this machine's rows under their
        own machine id: nothing reads them unless asked for that machine by name.
        """
        import pyarrow.parquet as pq

        records = pq.read_table(str(path)).to_pylist()
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
        new = 0
        with self._transaction():
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
                if old is None:
                    self._db.execute(
                        f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                        [r[c] for c in COLUMNS],
                    )
                    new += 1
                else:
                    merged = _merge(dict(old), {c: r[c] for c in COLUMNS})
                    self._db.execute(
                        f"UPDATE measurements SET {', '.join(f'{c}=?' for c in COLUMNS)} WHERE id=?",
                        [merged[c] for c in COLUMNS] + [old["id"]],
                    )
        return new


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
