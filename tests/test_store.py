"""The measurement store: one real SQLite file, unique rows, merges, Parquet exchange."""

import dataclasses
import sqlite3

import pyarrow.parquet as pq
import pytest

from mlirrl_jax.measure.fingerprint import fingerprint
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.schedule import Schedule, Transform
from mlirrl_jax.store import MeasurementStore, StoreError

SCHEDULE = Schedule.of({1: [Transform("tile", (8, 32, 1)), Transform("vectorize")]})


def measurement(program, schedule=SCHEDULE, status="ok", median=1e-3, **extra):
    ok = status == "ok"
    return Measurement(
        status=status,
        program=program.name,
        program_hash=program.hash,
        schedule=schedule.to_json(),
        schedule_hash=schedule.hash,
        median_s=median if ok else None,
        min_s=median * 0.9 if ok else None,
        spread=0.01 if ok else None,
        repeats=5 if ok else 0,
        verified=ok,
        max_error=1e-7,
        tolerance=1e-5,
        error=None if ok else f"{status} reason",
        fingerprint=fingerprint(),
        compile_s={"transform_s": 0.01},
        **extra,
    )


@pytest.fixture
def store(tmp_path, matmul):
    with MeasurementStore(tmp_path / "m.db") as s:
        s.add_programs([matmul])
        yield s


def machine():
    return fingerprint()["machine"]["machine_id"]


def test_wal_mode_and_one_row_per_key(store, matmul):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.put([measurement(matmul, median=1e-3)]) == 1
    assert store.put([measurement(matmul, median=3e-3)]) == 0  # same key: an update
    assert store.count() == 1
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row["n_measured"] == 2 and row["median_s"] == pytest.approx(2e-3)
    assert row["min_s"] == pytest.approx(0.9e-3) and row["samples"] == [1e-3, 3e-3]
    assert row["schedule"] == SCHEDULE.to_json() and row["verified"]


def test_other_threads_are_other_rows(store, matmul):
    store.put([measurement(matmul), measurement(matmul, threads=2)])
    assert store.count() == 2


def test_another_parallel_runtime_replaces_the_times(store, matmul):
    store.put([measurement(matmul, median=4e-3, threads=2, runtime="async")])
    store.put([measurement(matmul, median=1e-3, threads=2, runtime="openmp")])
    row = store.get(matmul.hash, SCHEDULE.hash, machine(), threads=2)
    assert row["runtime"] == "openmp" and row["samples"] == [1e-3]
    assert row["median_s"] == pytest.approx(1e-3) and row["min_s"] == pytest.approx(0.9e-3)
    assert row["n_measured"] == 2


def test_failures_keep_their_reason_and_never_a_time(store, matmul):
    store.put([measurement(matmul, status="crash")])
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row["status"] == "crash" and row["median_s"] is None and "crash reason" in row["error"]
    store.put([measurement(matmul)])  # later verified: the row becomes a time
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row["status"] == "ok" and row["n_failed"] == 1
    store.put([measurement(matmul, status="wrong_output")])  # never trusted again
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row["status"] == "wrong_output" and row["median_s"] is None and not row["verified"]


def test_a_failed_transaction_writes_nothing(store, matmul):
    good = measurement(matmul)
    orphan = dataclasses.replace(measurement(matmul, schedule=Schedule()), program_hash="f" * 64)
    with pytest.raises(StoreError, match="not in the store"):
        store.put([good, orphan])
    assert store.count() == 0


def test_parquet_round_trip_and_machine_check(store, matmul, tmp_path):
    store.put([measurement(matmul), measurement(matmul, schedule=Schedule(), median=5e-3)])
    path = tmp_path / "export.parquet"
    assert store.export_parquet(path) == 2
    with MeasurementStore(tmp_path / "other.db") as other:
        assert other.import_parquet(path) == 2
        assert other.import_parquet(path) == 0  # merges, no duplicates
        assert other.count() == 2
        assert other.program(matmul.hash).hash == matmul.hash  # self-contained
        # the schedule hash is left out of the file and derived again on import
        assert "schedule_hash" not in pq.read_table(path).column_names
        hashes = store.schedule_hashes(matmul.hash, machine(), 1)
        assert len(hashes) == 2 and other.schedule_hashes(matmul.hash, machine(), 1) == hashes
    # the same file claiming to come from another machine is refused by a store of this one
    table = pq.read_table(path)
    table = table.set_column(
        table.column_names.index("machine_id"), "machine_id", [["elsewhere"] * table.num_rows]
    )
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(table, foreign)
    with pytest.raises(StoreError, match="do not mix"):
        store.import_parquet(foreign)
    assert store.import_parquet(foreign, allow_other_machines=True) == 2
    assert store.machines() == {machine(), "elsewhere"}


def test_another_machines_rows_need_asking_for_even_in_an_empty_store(store, matmul, tmp_path):
    store.put([measurement(matmul), measurement(matmul, schedule=Schedule(), median=5e-3)])
    own = tmp_path / "own.parquet"
    store.export_parquet(own)
    table = pq.read_table(own)
    table = table.set_column(
        table.column_names.index("machine_id"), "machine_id", [["prior"] * table.num_rows]
    )
    foreign = tmp_path / "prior.parquet"
    pq.write_table(table, foreign)
    with MeasurementStore(tmp_path / "fresh.db") as fresh:
        # an empty store is no exception, and the error names the command-line flag
        with pytest.raises(StoreError, match="--allow-other-machines") as refused:
            fresh.import_parquet(foreign)
        assert "prior (2 rows)" in str(refused.value) and fresh.count() == 0
        assert fresh.import_parquet(foreign, allow_other_machines=True) == 2
        # this machine's own export still comes in without the flag, beside the prior's rows
        assert fresh.import_parquet(own) == 2
        assert fresh.count(machine_id=machine()) == fresh.count(machine_id="prior") == 2
        assert {r["machine_id"] for r in fresh.rows(machine_id=machine())} == {machine()}


def test_schema_version_is_checked(tmp_path):
    path = tmp_path / "v.db"
    MeasurementStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        MeasurementStore(path)


def test_data_card_describes_machine_and_counts(store, matmul):
    store.put([measurement(matmul), measurement(matmul, schedule=Schedule(), status="timeout")])
    card = store.card(machine(), "Seed", "mlirrl-jax collect --budget 2")
    assert f"`{machine()}`" in card and "ok 1, timeout 1" in card
    assert "mlirrl-jax collect --budget 2" in card
    with pytest.raises(StoreError, match="no measurements"):
        store.card("nowhere", "x", "")
