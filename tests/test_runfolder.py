"""One process per run folder, outputs checked before slow work, a full disk named in one line,
a failed start leaving nothing behind: real processes on real folders; a fake only where a
fault (a full disk) is injected, and it says so."""

import errno
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys

import pytest
from conftest import MATMUL

from mlirrl_jax.cli import main
from mlirrl_jax.runfolder import LOCK, RunFolderError, run_lock, write_atomic
from mlirrl_jax.shipped import SHIPPED_AGENT, SHIPPED_SURROGATE

# Runs the CLI's main in a fresh process and reports, on its last stderr line, the seconds main
# took and whether JAX was imported: the lock and the checks must come before JAX's start-up.
MAIN = """
import sys, time
from mlirrl_jax.cli import main
started = time.perf_counter()
code = main(sys.argv[1:])
print(f"main took {time.perf_counter() - started:.3f} s, jax {'jax' in sys.modules}", file=sys.stderr)
sys.exit(code)
"""

# Holds a folder's lock until its stdin closes (or is refused: exit 2 with the error line).
HOLD = """
import sys
from mlirrl_jax.runfolder import RunFolderError, run_lock
try:
    with run_lock(sys.argv[1], "holder " + sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
except RunFolderError as exc:
    print(exc, flush=True)
    sys.exit(2)
"""


def run_main(*args: str) -> tuple[int, str, float, bool]:
    """(exit code, the error line, seconds in main, JAX imported) of the CLI in a new process."""
    done = subprocess.run(
        [sys.executable, "-c", MAIN, *args], capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    *_, error, timing = lines
    seconds, jax = timing.removeprefix("main took ").split(" s, jax ")
    return done.returncode, error, float(seconds), jax == "True"


def hold(folder) -> subprocess.Popen:
    """A process holding `folder`'s lock (it has printed "held")."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def release(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    assert holder.wait(timeout=30) == 0


def dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def kernel(tmp_path):
    path = tmp_path / "mm.mlir"
    path.write_text(MATMUL)
    return path


def test_a_second_process_on_a_run_folder_is_refused_at_once(tmp_path, kernel):
    run = tmp_path / "run"
    run.mkdir()
    holder = hold(run)
    try:
        for command in (
            ["train", "--out", str(run), "--resume"],
            ["validate", str(kernel), "--run", str(SHIPPED_AGENT), "--out", str(run)],
            ["optimize", str(kernel), "--out", str(run)],
            ["demo", "--out", str(run)],
        ):
            code, error, in_main, jax = run_main(*command)
            assert code == 2 and error.startswith(f"error: {run} is in use by pid {holder.pid}")
            assert f"holder {run}" in error and socket.gethostname() in error
            assert in_main < 2.0 and not jax  # refused before JAX's start-up
        assert json.loads((run / LOCK).read_text())["pid"] == holder.pid  # untouched
    finally:
        release(holder)
    assert os.listdir(run) == []  # released: the lock file is gone


def test_a_stale_lock_is_taken_over_by_exactly_one_of_racing_processes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = dead_pid()
    stale = {"pid": dead, "host": socket.gethostname(), "since": "earlier", "command": "killed"}
    (run / LOCK).write_text(json.dumps(stale))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(run)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    first = {racer: racer.stdout.readline().strip() for racer in racers}
    winners = [racer for racer, line in first.items() if line == "held"]
    assert len(winners) == 1, first
    winner = winners[0]
    assert json.loads((run / LOCK).read_text())["pid"] == winner.pid
    for racer in racers:
        if racer is not winner:
            assert racer.wait(timeout=30) == 2
            assert f"in use by pid {winner.pid}" in first[racer]
    release(winner)
    assert f"taking over the lock of pid {dead}" in winner.stderr.read()
    assert not (run / LOCK).exists()


def test_a_lock_of_another_host_is_not_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record = json.dumps({"pid": 4242, "host": "elsewhere", "since": "then", "command": "train"})
    (run / LOCK).write_text(record)
    with pytest.raises(RunFolderError) as refused:
        with run_lock(run):
            pass
    message = str(refused.value)
    assert "pid 4242 on host elsewhere" in message and f"remove {run / LOCK}" in message
    assert (run / LOCK).read_text() == record


def test_the_lock_is_released_on_an_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(RuntimeError, match="the job failed"):
        with run_lock(run):
            assert json.loads((run / LOCK).read_text())["pid"] == os.getpid()
            raise RuntimeError("the job failed")
    assert not (run / LOCK).exists()
    with run_lock(run):  # free again
        pass


def test_optimize_into_an_existing_file_is_refused_before_the_agent_loads(tmp_path, kernel):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    code, error, in_main, jax = run_main("optimize", str(kernel), "--out", str(taken))
    assert code == 2 and error == f"error: output folder {taken} is a file: choose another folder"
    assert in_main < 2.0 and not jax
    assert taken.read_text() == "mine"


def test_missing_inputs_are_named_and_nothing_is_created(tmp_path, kernel, capsys):
    out = tmp_path / "new" / "out"
    cases = [
        (["optimize", str(kernel), "--out", str(out), "--run", str(tmp_path / "norun")], "norun"),
        (["optimize", str(tmp_path / "nokernel.mlir"), "--out", str(out)], "nokernel.mlir"),
        (["validate", str(tmp_path / "gone.mlir"), "--out", str(out)], "gone.mlir: no such file"),
        (["validate", str(kernel), "--run", str(tmp_path), "--out", str(out)], "no checkpoint"),
        (["train", "--out", str(out), "--resume"], "nothing to resume"),
        (["train", "--out", str(out), "--init-agent", str(tmp_path / "x")], "no such run"),
        (["train", "--out", str(out), "--config", str(tmp_path / "c.json")], "c.json"),
        (["train", "--out", str(tmp_path / "taken" / "run")], "lies under"),
    ]
    (tmp_path / "taken").write_text("a file")
    for command, named in cases:
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "Traceback" not in err and named in err.strip().splitlines()[-1], (command, err)
        assert not (tmp_path / "new").exists(), command


def test_write_atomic_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")

    def full_disk(fd):  # fault injection: the disk fills as the new file is synced
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError) as failed:
        write_atomic(path, "new")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.json"]


@pytest.mark.skipif(not (SHIPPED_AGENT / "checkpoints").is_dir(), reason="no shipped agent")
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(
    tmp_path, kernel, monkeypatch, capsys
):
    real_fsync = os.fsync

    def full_disk(fd):  # fault injection: no space left when validation's first file is synced
        if "validation_config.json" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for out in (tmp_path / "fresh", kept):
        command = ["validate", str(kernel), "--run", str(SHIPPED_AGENT), "--threads", "1"]
        assert main([*command, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err
        assert last == (
            f"error: no space left on device writing {out / 'validation_config.json'}: "
            "free space and rerun; nothing saved before was lost"
        )
    assert not (tmp_path / "fresh").exists()  # a folder this start created: removed
    assert os.listdir(kept) == ["notes.txt"]  # one that existed: only what it made is gone


def test_a_full_store_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mlirrl_jax.shipped import SHIPPED_SEEDS
    from mlirrl_jax.store import MeasurementStore

    seed = pq.ParquetFile(next(SHIPPED_SEEDS.glob("*.parquet")))
    few = tmp_path / "few.parquet"  # 200 real rows of the seed: more than an empty store holds
    pq.write_table(pa.Table.from_batches([next(seed.iter_batches(batch_size=200))]), few)
    store = tmp_path / "full.db"
    MeasurementStore(store).close()
    connect = sqlite3.connect

    def no_room(*args, **kwargs):  # fault injection: a real SQLITE_FULL, the file kept at its size
        connection = connect(*args, **kwargs)
        connection.execute("PRAGMA max_page_count = 1")  # SQLite raises it to the current size
        return connection

    monkeypatch.setattr(sqlite3, "connect", no_room)
    command = ["store", "import", str(few), "--store", str(store), "--allow-other-machines"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"error: no space left on device writing {store}: free space and rerun; nothing saved "
        "before was lost"
    )
    monkeypatch.undo()
    with MeasurementStore(store, create=False) as intact:  # the failed import rolled back
        assert intact.count() == 0


def test_a_failed_train_start_leaves_no_run_folder(tmp_path):
    surrogate = tmp_path / "surrogate"
    shutil.copytree(SHIPPED_SURROGATE, surrogate)
    model = surrogate / "model.json"
    model.write_bytes(model.read_bytes()[:200])  # cut short, as by a full disk or a kill
    run = tmp_path / "runs" / "new"
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for out in (run, existing):
        code, error, _, _ = run_main(  # a process of its own: JAX takes every core at start
            "train", "--out", str(out), "--surrogate", str(surrogate), "--iterations", "1"
        )
        assert code == 2 and error.startswith(f"error: {model}: damaged")
    assert not (tmp_path / "runs").exists()
    assert os.listdir(existing) == ["notes.txt"]
