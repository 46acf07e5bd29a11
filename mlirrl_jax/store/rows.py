"""A measurement as a store row, and rows merged: the statistics of two rows of one key, and the
shares of their origins that make imports idempotent."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import statistics
import time
from dataclasses import dataclass

from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.store.schema import MAX_SAMPLES, Share


def measurement_key(m: Measurement) -> tuple[str, str, str, int]:
    """A measurement's row key: (program hash, schedule hash, machine id, threads)."""
    return (m.program_hash, m.schedule_hash, m.fingerprint["machine"]["machine_id"], m.threads)


def row_lineage(row) -> str:
    """The origin of the measurements of the row where they were first taken: its key and the
    time of its first measurement (exact, as repr), which every later version and copy keeps."""
    text = f"{row['machine_id']} {row['program_hash']} {row['schedule_hash']} {row['threads']}"
    return "row:" + hashlib.sha256(f"{text} {row['created_at']!r}".encode()).hexdigest()[:16]


def share_of(origin: sqlite3.Row) -> Share:
    return Share(origin["n_measured"], origin["n_failed"], json.loads(origin["samples"]))


def rest_share(row, shares: dict[str, Share]) -> Share:
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


def row_provenance(row, shares: dict[str, Share]) -> str:
    """An exported row's shares by origin (JSON), but its lineage's: an importer credits the
    lineage with the rest (`exported_shares`), as it does a row exported without them."""
    lineage = row_lineage(row)
    listed = {o: list(s) for o, s in shares.items() if s.measured > 0 and o != lineage}
    return json.dumps(listed, sort_keys=True, separators=(",", ":"))


def exported_shares(record: dict) -> dict[str, Share]:
    """An exported row's shares by origin: those its provenance lists, and the rest its own
    lineage's (all of it, from a file of schema 1)."""
    listed = {o: Share(*s) for o, s in json.loads(record.get("provenance") or "{}").items()}
    rest = rest_share(record, listed)
    return {**listed, row_lineage(record): rest} if rest.measured > 0 else listed


def row_of(m: Measurement) -> dict:
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


def merged_rows(old: dict, new: dict) -> dict:
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


@dataclass(frozen=True)
class StoredRow:
    """One row of the `measurements` table, its JSON columns decoded (`MeasurementStore.get`):
    the merged statistics of every measurement of one (program, schedule, machine, threads)."""

    id: int
    program_hash: str
    program_name: str
    schedule_hash: str
    schedule: dict
    machine_id: str
    toolchain_id: str
    fingerprint: dict
    threads: int
    runtime: str
    method: dict
    status: str
    verified: bool
    median_s: float | None
    min_s: float | None
    spread: float | None
    samples: list
    n_measured: int
    n_failed: int
    max_error: float | None
    error: str | None
    compile_s: float | None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: sqlite3.Row) -> StoredRow:
        return cls(**decoded_row(row))

    @property
    def seconds(self) -> float | None:
        """The verified median time, else None (a failure, or no time)."""
        return self.median_s if self.status == "ok" and self.verified else None


def decoded_row(row: sqlite3.Row) -> dict:
    out = dict(row)
    for column in ("schedule", "fingerprint", "method", "samples"):
        out[column] = json.loads(out[column])
    out["verified"] = bool(out["verified"])
    return out
