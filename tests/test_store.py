"""The measurement store: one real SQLite file, unique rows, merges, Parquet exchange."""

import dataclasses
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mlirrl_jax.cli import main
from mlirrl_jax.measure.fingerprint import fingerprint
from mlirrl_jax.measure.profile import this_machine_profile
from mlirrl_jax.measure.timing import Measurement
from mlirrl_jax.schedule import Schedule, Transform
from mlirrl_jax.store import (
    CLAIM_MAX_AGE_S,
    PROFILES_KEY,
    SCHEMA_VERSION,
    STORED,
    ClaimOwner,
    ImportReport,
    MeasurementStore,
    StoreError,
)

SCHEDULE = Schedule.of({1: [Transform("tile", (8, 32, 1)), Transform("vectorize")]})
SEED = sorted((Path(__file__).resolve().parent.parent / "data" / "seed").glob("*.parquet"))[0]
# two programs of the seed whose rows include ones measured twice and failures
SEED_PROGRAMS = ["suite://dl-v0/add_1x28x28x512", "suite://dl-v0/softmax_exp_r3072_c256"]


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
    assert row.n_measured == 2 and row.median_s == pytest.approx(2e-3)
    assert row.min_s == pytest.approx(0.9e-3) and row.samples == [1e-3, 3e-3]
    assert row.schedule == SCHEDULE.to_json() and row.verified


def test_other_threads_are_other_rows(store, matmul):
    store.put([measurement(matmul), measurement(matmul, threads=2)])
    assert store.count() == 2


def test_another_parallel_runtime_replaces_the_times(store, matmul):
    store.put([measurement(matmul, median=4e-3, threads=2, runtime="async")])
    store.put([measurement(matmul, median=1e-3, threads=2, runtime="openmp")])
    row = store.get(matmul.hash, SCHEDULE.hash, machine(), threads=2)
    assert row.runtime == "openmp" and row.samples == [1e-3]
    assert row.median_s == pytest.approx(1e-3) and row.min_s == pytest.approx(0.9e-3)
    assert row.n_measured == 2


def test_failures_keep_their_reason_and_never_a_time(store, matmul):
    store.put([measurement(matmul, status="crash")])
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row.status == "crash" and row.median_s is None and "crash reason" in row.error
    store.put([measurement(matmul)])  # later verified: the row becomes a time
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row.status == "ok" and row.n_failed == 1
    store.put([measurement(matmul, status="wrong_output")])  # never trusted again
    row = store.get(matmul.hash, SCHEDULE.hash, machine())
    assert row.status == "wrong_output" and row.median_s is None and not row.verified


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
        assert other.import_parquet(path) == ImportReport(new=2)
        assert other.import_parquet(path) == ImportReport(skipped=2)  # no duplicates
        assert other.count() == 2
        assert other.program(matmul.hash).hash == matmul.hash  # self-contained
        # the schedule hash is left out of the file and derived again on import
        assert "schedule_hash" not in pq.read_table(path).column_names
        hashes = {h for _, _, h in store.keys_since(0, machine())}
        assert len(hashes) == 2 and {h for _, _, h in other.keys_since(0, machine())} == hashes
    # the same file claiming to come from another machine is refused by a store of this one
    table = pq.read_table(path)
    table = table.set_column(
        table.column_names.index("machine_id"), "machine_id", [["elsewhere"] * table.num_rows]
    )
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(table, foreign)
    with pytest.raises(StoreError, match="do not mix"):
        store.import_parquet(foreign)
    assert store.import_parquet(foreign, allow_other_machines=True).new == 2
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
        assert fresh.import_parquet(foreign, allow_other_machines=True).new == 2
        # this machine's own export still comes in without the flag, beside the prior's rows
        assert fresh.import_parquet(own).new == 2
        assert fresh.count(machine_id=machine()) == fresh.count(machine_id="prior") == 2
        assert {r["machine_id"] for r in fresh.rows(machine_id=machine())} == {machine()}


def every_row(path) -> list[tuple]:
    """Every column of every measurement row, in order: all that an import could change."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM measurements ORDER BY id").fetchall()


def statistics_of(store, program, schedule=SCHEDULE) -> tuple:
    row = store.get(program.hash, schedule.hash, machine())
    return row.n_measured, row.n_failed, sorted(row.samples), row.median_s


def test_the_same_file_imported_three_times_counts_once(tmp_path, capsys):
    # as the tester did: a slice of the shipped seed (an export of schema 1, without
    # provenance, of another machine), imported again and again through the command line
    part = tmp_path / "seed-part.parquet"
    pq.write_table(pq.read_table(SEED, filters=[("program_name", "in", SEED_PROGRAMS)]), part)
    source = pq.read_table(part).to_pylist()
    assert "provenance" not in source[0] and {r["n_measured"] for r in source} > {1}
    path = tmp_path / "s.db"
    args = ["store", "import", str(part), "--store", str(path), "--allow-other-machines"]
    assert main(args) == 0
    assert f"{len(source)} new rows, 0 merged" in capsys.readouterr().out
    first = every_row(path)
    for _ in range(2):
        assert main(args) == 0
        out = capsys.readouterr().out
        assert f"0 new rows, 0 merged into stored rows, {len(source)} skipped" in out
    assert every_row(path) == first  # byte for byte, timestamps included
    with MeasurementStore(path) as store:
        stored = {(r["program_hash"], r["schedule_hash"]): r for r in store.rows()}
    for r in source:  # and each row holds just what the file does
        row = stored[r["program_hash"], Schedule.loads(r["schedule"]).hash]
        assert (row["n_measured"], row["n_failed"], row["samples"], row["median_s"]) == (
            r["n_measured"],
            r["n_failed"],
            json.loads(r["samples"]),
            r["median_s"],
        )


def test_later_exports_and_copies_measured_further_add_only_what_is_new(store, matmul, tmp_path):
    store.put([measurement(matmul, median=1e-3)])
    store.export_parquet(tmp_path / "v1.parquet")
    store.put([measurement(matmul, median=2e-3), measurement(matmul, status="timeout")])
    store.put([measurement(matmul, schedule=Schedule(), median=5e-3)])
    store.export_parquet(tmp_path / "v2.parquet")
    assert statistics_of(store, matmul)[:3] == (3, 1, [1e-3, 2e-3])
    # an export and a later, larger one of the same store, in either order: each once
    for order, reports in (
        (["v1", "v2"], [ImportReport(new=1), ImportReport(new=1, merged=1)]),
        (["v2", "v1"], [ImportReport(new=2), ImportReport(skipped=1)]),
    ):
        with MeasurementStore(tmp_path / f"{order[0]}-first.db") as copy:
            assert [copy.import_parquet(tmp_path / f"{v}.parquet") for v in order] == reports
            assert statistics_of(copy, matmul) == statistics_of(store, matmul)
    # a fork: another store measured the row itself, merged v1 in, measured again, exported
    with MeasurementStore(tmp_path / "fork.db") as fork:
        fork.add_programs([matmul])
        fork.put([measurement(matmul, median=4e-3)])
        fork.import_parquet(tmp_path / "v1.parquet")
        fork.put([measurement(matmul, median=6e-3)])
        fork.export_parquet(tmp_path / "fork.parquet")
    everything = (5, 1, [1e-3, 2e-3, 4e-3, 6e-3], 3e-3)
    with MeasurementStore(tmp_path / "all.db") as combined:
        for name in ("v2", "fork", "v1", "fork", "v2"):
            combined.import_parquet(tmp_path / f"{name}.parquet")
        assert statistics_of(combined, matmul) == everything
        # back into the first store, only the fork's own two measurements come in
        assert store.import_parquet(tmp_path / "fork.parquet") == ImportReport(merged=1)
        assert store.import_parquet(tmp_path / "fork.parquet") == ImportReport(skipped=1)
        assert statistics_of(store, matmul) == everything
        # and its export of it all brings the combined store nothing it lacks
        store.export_parquet(tmp_path / "v3.parquet")
        assert combined.import_parquet(tmp_path / "v3.parquet") == ImportReport(skipped=2)


def test_a_store_of_schema_1_is_migrated_and_imports_its_old_exports_once(store, matmul, tmp_path):
    store.put([measurement(matmul, median=1e-3), measurement(matmul, median=2e-3)])
    exported = tmp_path / "export.parquet"
    store.export_parquet(exported)
    old_export = tmp_path / "old.parquet"  # as schema 1 wrote it: no provenance
    pq.write_table(pq.read_table(exported).drop(["provenance"]), old_export)
    before = every_row(store.path)
    store.close()
    with sqlite3.connect(store.path) as db:  # the store as schema 1 left it
        db.executescript(
            "DROP TABLE origins; DROP TABLE claims; DELETE FROM meta WHERE key='store_id'; "
            "UPDATE meta SET value='1' WHERE key='schema_version';"
        )
    with MeasurementStore(store.path) as migrated:
        assert migrated._meta("schema_version") == str(SCHEMA_VERSION) and migrated.store_id
        assert every_row(migrated.path) == before
        assert migrated.import_parquet(old_export) == ImportReport(skipped=1)
        migrated.put([measurement(matmul, median=3e-3)])
        migrated.export_parquet(exported)
    with MeasurementStore(tmp_path / "reader.db") as reader:
        assert reader.import_parquet(old_export) == ImportReport(new=1)
        assert reader.import_parquet(exported) == ImportReport(merged=1)  # only the third
        assert statistics_of(reader, matmul) == (3, 0, [1e-3, 2e-3, 3e-3], 2e-3)


def test_machine_profiles_travel_with_exports(store, matmul, tmp_path):
    store.put([measurement(matmul)])  # the first rows of this machine record its profile
    assert store.machine_profiles() == {machine(): this_machine_profile()}
    path = tmp_path / "export.parquet"
    store.export_parquet(path)
    given = json.loads(pq.read_schema(path).metadata[PROFILES_KEY])
    assert given == [this_machine_profile().to_json()]
    with MeasurementStore(tmp_path / "other.db") as other:
        other.import_parquet(path)
        assert other.machine_profiles() == store.machine_profiles()
    # another machine's export brings that machine's profile, which its rows keep
    table = pq.read_table(path)
    table = table.set_column(
        table.column_names.index("machine_id"), "machine_id", [["elsewhere"] * table.num_rows]
    )
    theirs = dataclasses.replace(this_machine_profile(), machine_id="elsewhere", cores=64)
    table = table.replace_schema_metadata({PROFILES_KEY: json.dumps([theirs.to_json()])})
    pq.write_table(table, tmp_path / "foreign.parquet")
    store.import_parquet(tmp_path / "foreign.parquet", allow_other_machines=True)
    assert store.machine_profiles() == {machine(): this_machine_profile(), "elsewhere": theirs}
    # a profile once recorded stays: the features of a machine's rows never move
    assert not store.record_machine(dataclasses.replace(theirs, cores=8))
    assert store.machine_profiles()["elsewhere"].cores == 64


def test_a_store_of_schema_2_opens_and_records_its_machines(store, matmul):
    store.put([measurement(matmul)])
    before = every_row(store.path)
    store.close()
    with sqlite3.connect(store.path) as db:  # the store as schema 2 left it
        db.executescript(
            "DROP TABLE machines; UPDATE meta SET value='2' WHERE key='schema_version';"
        )
    with MeasurementStore(store.path) as migrated:
        assert migrated._meta("schema_version") == str(SCHEMA_VERSION)
        assert every_row(migrated.path) == before
        assert migrated.machine_profiles() == {machine(): this_machine_profile()}


def dead_pid() -> int:
    """The pid of a process that has ended, as a job killed with -9 has."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def claims(store) -> dict[tuple, str]:
    rows = store._db.execute("SELECT program_hash, schedule_hash, threads, owner FROM claims")
    return {(r[0], r[1], r[2]): r[3] for r in rows}


def test_claims_hold_while_their_owner_lives_and_are_taken_over_after(store, matmul):
    task = (matmul.hash, SCHEDULE.hash, machine(), 1)
    mine, other = ClaimOwner.here(), ClaimOwner.here()  # two jobs of this live process
    assert store.claim(*task, mine) is None and store.claim(*task, mine) is None
    here = socket.gethostname()
    assert store.claim(*task, other) == f"claimed by pid {os.getpid()} on {here}"
    # a dead owner's claim is taken over, and dropped when a job looks for others
    dead = ClaimOwner("dead-job", here, dead_pid())
    baseline = (matmul.hash, Schedule().hash, machine(), 1)
    threaded = (matmul.hash, SCHEDULE.hash, machine(), 2)
    assert store.claim(*baseline, dead) is None and store.claim(*threaded, dead) is None
    assert store.claim(*baseline, other) is None
    assert claims(store)[matmul.hash, Schedule().hash, 1] == other.token
    assert store.other_claimants(mine) == {os.getpid()}
    assert "dead-job" not in claims(store).values()
    # another host's owner cannot be checked: its claim holds until it is CLAIM_MAX_AGE_S old
    far = ClaimOwner("far-job", "elsewhere", 1)
    assert store.claim(*threaded, far) is None
    assert store.claim(*threaded, mine) == "claimed by pid 1 on elsewhere"
    store._db.execute("UPDATE claims SET claimed_at = claimed_at - ?", (CLAIM_MAX_AGE_S,))
    assert store.claim(*threaded, mine) is None
    # a stored result releases its claim, and its task is claimed no more
    store.put([measurement(matmul)], claimed_by=mine)
    assert (matmul.hash, SCHEDULE.hash, 1) not in claims(store)
    assert store.claim(*task, other) == STORED
    store.release(other)
    store.release(mine)
    assert claims(store) == {}


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
    card = store.card(machine(), "Seed", "mlirrl-jax collect --rows 2")
    assert f"`{machine()}`" in card and "ok 1, timeout 1" in card
    assert "mlirrl-jax collect --rows 2" in card
    with pytest.raises(StoreError, match="no measurements"):
        store.card("nowhere", "x", "")
