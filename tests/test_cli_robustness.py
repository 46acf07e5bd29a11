"""The command line on bad input: one clear line naming the problem, a nonzero code, nothing
created or measured that should not be; Ctrl-C stops a job and leaves its store consistent."""

import contextlib
import gc
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from mlirrl_jax.cli import build_parser, main
from mlirrl_jax.cli.measure import schedule_to_measure
from mlirrl_jax.env.replay import HostState, replay, state_of_schedule
from mlirrl_jax.env.state import EncodingError
from mlirrl_jax.env.table import encode_programs
from mlirrl_jax.errors import ConfigError
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.interrupt import check_stop, stop_on_ctrl_c
from mlirrl_jax.programs import generate, suites
from mlirrl_jax.programs.ir import load_program, parse_program
from mlirrl_jax.schedule import TILE_PARALLEL, Schedule, ScheduleError
from mlirrl_jax.store import MeasurementStore, StoreError
from tests.conftest import MATMUL


def error_of(capsys) -> str:
    """The one-line error `main` printed last on stderr, checked to come without a traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err
    return last


@pytest.fixture
def matmul_file(tmp_path):
    path = tmp_path / "mm.mlir"
    path.write_text(MATMUL)
    return path


def write_schedule(path, ops) -> str:
    path.write_text(json.dumps({"ops": ops}))
    return str(path)


@pytest.fixture
def filled_store(tmp_path):
    """A real store of a dozen suite programs: several pages of SQLite."""
    path = tmp_path / "full.db"
    with MeasurementStore(path) as store:
        store.add_programs(load_program(e.uri) for e in suites.split("dl-v0", "train")[:12])
    return path


def test_a_truncated_or_foreign_store_file_is_named(tmp_path, filled_store, capsys):
    data = filled_store.read_bytes()
    assert len(data) >= 4 * 4096
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(data[: len(data) // 2])
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"this is not a database\n" * 200)
    for path, problem in ((truncated, "truncated"), (foreign, "not an SQLite file")):
        with pytest.raises(StoreError, match=problem):
            MeasurementStore(path)
        assert main(["store", "summary", "--store", str(path)]) == 2
        err = error_of(capsys)
        assert str(path) in err and problem in err
        collect = ["collect", "--store", str(path), "--rows", "1", "--max-programs", "1"]
        assert main(collect) == 2
        err = error_of(capsys)
        assert str(path) in err and problem in err
    assert main(["store", "summary", "--store", str(filled_store)]) == 0  # the intact one reads


def test_readers_never_create_a_store(tmp_path, filled_store, capsys):
    missing = tmp_path / "nodir" / "x.db"
    for action in (["summary"], ["export", str(tmp_path / "out.parquet")], ["card"]):
        assert main(["store", *action, "--store", str(missing)]) == 2
        err = error_of(capsys)
        assert str(missing) in err and "no such measurement store" in err
    with pytest.raises(StoreError, match="no such measurement store"):
        MeasurementStore(missing, create=False)
    assert not missing.parent.exists()
    # an SQLite file that is not a store is not turned into one by a reader
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(StoreError, match="no measurement store tables"):
        MeasurementStore(empty, create=False)
    # writers still create: an import into a new store
    export = tmp_path / "programs.parquet"
    assert main(["store", "export", str(export), "--store", str(filled_store)]) == 0
    new = tmp_path / "newdir" / "y.db"
    assert main(["store", "import", str(export), "--store", str(new)]) == 0
    assert new.is_file()
    with MeasurementStore(new, create=False) as store:
        assert store.summary()["measurements"] == 0


def test_the_ray_backend_without_ray_fails_before_creating_the_store(tmp_path, monkeypatch, capsys):
    # fault injection: Ray is installed here; a None entry makes `import ray` fail as if not
    monkeypatch.setitem(sys.modules, "ray", None)
    store = tmp_path / "new" / "m.db"
    command = ["collect", "--store", str(store), "--rows", "1", "--max-programs", "1"]
    assert main([*command, "--backend", "ray"]) == 2
    err = error_of(capsys)
    assert "pip install" in err and "ray" in err
    assert not store.exists() and not store.parent.exists()


def test_a_ray_address_without_the_ray_backend_is_refused_before_the_store(tmp_path, capsys):
    store = tmp_path / "new" / "m.db"
    command = ["collect", "--store", str(store), "--rows", "1", "--max-programs", "1"]
    assert main([*command, "--address", "ray://head:10001"]) == 2
    assert error_of(capsys) == (
        "error: address 'ray://head:10001' names a Ray cluster, which only the 'ray' backend "
        "uses; this job's backend is 'local'"
    )
    assert not store.parent.exists()  # nothing created, nothing measured
    from mlirrl_jax.collect import CollectConfig, CollectionJob

    with pytest.raises(ConfigError, match="only the 'ray' backend uses"):
        CollectionJob(CollectConfig(store=store, budget=1, address="ray://head:10001"))
    assert not store.parent.exists()


def test_a_bad_or_empty_schedule_mix_is_refused_by_name_before_the_store(tmp_path, capsys):
    store = tmp_path / "new" / "m.db"
    command = ["collect", "--store", str(store), "--rows", "1", "--max-programs", "1"]
    for mix, problem in [
        ("", "--mix names no schedule source"),
        ("random:inf,heuristic:1", "--mix share of 'random' must be finite and positive, got inf"),
    ]:
        assert main([*command, "--mix", mix]) == 2
        assert error_of(capsys) == f"error: {problem}"
    assert not store.parent.exists()


def test_a_flag_that_needs_another_is_refused_without_it_naming_both(tmp_path, capsys):
    kernel, out = tmp_path / "k.mlir", tmp_path / "out"
    kernel.write_text(MATMUL)
    assert main(["optimize", str(kernel), "--out", str(out), "--search-budget", "8"]) == 2
    err = error_of(capsys)
    assert "--search-budget" in err and "--search evolutionary" in err
    assert main(["optimize-model", str(tmp_path), "--out", str(out), "--search-budget", "8"]) == 2
    err = error_of(capsys)
    assert "--search-budget" in err and "--search-top N" in err
    assert not out.exists()


def test_a_binary_program_file_is_named(tmp_path, capsys):
    binary = tmp_path / "kernel.mlir"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 8)
    assert main(["measure", str(binary)]) == 2
    err = error_of(capsys)
    assert str(binary) in err and "not UTF-8 text" in err
    assert main(["show", str(binary)]) == 2
    assert str(binary) in error_of(capsys)


def test_a_binary_schedule_file_is_named(tmp_path, matmul_file, capsys):
    binary = tmp_path / "s.json"
    binary.write_bytes(b"\xff\xfe{\x00")
    assert main(["measure", str(matmul_file), "--schedule", str(binary)]) == 2
    err = error_of(capsys)
    assert str(binary) in err and "not UTF-8 text" in err


@pytest.mark.parametrize(
    "transform, field",
    [
        ({"kind": "tile", "sizes": "abc"}, "sizes"),
        ({"kind": "tile", "sizes": [8.5, 32, 1]}, "sizes"),
        ({"kind": "tile", "sizes": [8.0, 32, 1]}, "sizes"),
        ({"kind": "tile", "sizes": [True, 32, 1]}, "sizes"),
        ({"kind": "tile", "sizes": ["8", 32, 1]}, "sizes"),
        ({"kind": "interchange", "permutation": [0, 2.0, 1]}, "permutation"),
    ],
)
def test_schedule_fields_must_be_integers(tmp_path, matmul_file, capsys, transform, field):
    schedule = write_schedule(tmp_path / "s.json", [{"op": 1, "transforms": [transform]}])
    with pytest.raises(ScheduleError, match=f"{field} must be a list of integers"):
        Schedule.load(schedule)
    assert main(["measure", str(matmul_file), "--schedule", schedule]) == 2
    err = error_of(capsys)
    assert schedule in err and "op 1, transform 0" in err and transform["kind"] in err
    assert f"{field} must be a list of integers" in err


def test_an_op_id_must_be_an_integer(tmp_path):
    schedule = write_schedule(tmp_path / "s.json", [{"op": 1.0, "transforms": []}])
    with pytest.raises(ScheduleError, match=r"s\.json: ops\[0\]: op must be an integer"):
        Schedule.load(schedule)


@pytest.mark.parametrize(
    "option",
    [
        ["--threads", "0"],
        ["--threads", "-2"],
        ["--threads", "1.5"],
        ["--timeout", "-1"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--mem-limit", "0"],
    ],
)
def test_measure_options_must_be_positive(tmp_path, capsys, option):
    # the program does not exist: were the option taken, the error would be the missing file
    with pytest.raises(SystemExit) as exit:
        main(["measure", str(tmp_path / "missing.mlir"), *option])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option[0]}" in err and "missing.mlir" not in err


@pytest.mark.parametrize(
    "options",
    [
        ["--rows", "0"],
        ["--hours", "-1"],
        ["--rows", "1", "--workers", "0"],
        ["--rows", "1", "--max-mflops", "0"],
    ],
)
def test_collect_options_must_be_positive(tmp_path, capsys, options):
    store = tmp_path / "m.db"
    with pytest.raises(SystemExit) as exit:
        main(["collect", "--store", str(store), *options])
    assert exit.value.code == 2
    assert f"argument {options[-2]}" in capsys.readouterr().err
    assert not store.exists()


def chain_of_relus(n: int) -> str:
    """MLIR text of `n` element-wise ops in a chain."""
    lines = [
        "#id = affine_map<(i) -> (i)>",
        "func.func @chain(%x0: tensor<16xf32>) -> tensor<16xf32> {",
        "  %zero = arith.constant 0.0 : f32",
    ]
    for i in range(n):
        lines += [
            f"  %e{i} = tensor.empty() : tensor<16xf32>",
            f"  %x{i + 1} = linalg.generic {{indexing_maps = [#id, #id], "
            'iterator_types = ["parallel"]}',
            f"      ins(%x{i} : tensor<16xf32>) outs(%e{i} : tensor<16xf32>) {{",
            "  ^bb0(%a: f32, %o: f32):",
            "    %m = arith.maximumf %a, %zero : f32",
            "    linalg.yield %m : f32",
            "  } -> tensor<16xf32>",
        ]
    lines += [f"  return %x{n} : tensor<16xf32>", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize(
    "text, limit",
    [
        (chain_of_relus(9), "9 ops, the environment takes 8"),
        (generate.render(generate.ElementwiseSpec("relu", (2,) * 9)), "9 loops"),
    ],
)
def test_a_program_too_large_for_the_environment_fails_alike_on_host_and_in_the_table(text, limit):
    program = parse_program(text, "too_large")
    with pytest.raises(EncodingError, match=limit) as table:
        encode_programs([program])
    with pytest.raises(EncodingError, match=limit) as host:
        HostState.initial(program)
    assert str(host.value) == str(table.value)
    with pytest.raises(EncodingError, match=limit):
        replay(program, [])
    with pytest.raises(EncodingError, match=limit):
        state_of_schedule(program, heuristic_schedule(program))


@pytest.mark.parametrize(
    "ops, problem",
    [
        ([{"op": 7, "transforms": [{"kind": "vectorize"}]}], "program has [0, 1]"),
        (
            [{"op": 1, "transforms": [{"kind": "interchange", "permutation": [1, 0]}]}],
            "must permute loops [0, 1, 2]",
        ),
        ([{"op": 1, "transforms": [{"kind": "tile", "sizes": [8, 32]}]}], "2 sizes for 3 loops"),
    ],
)
def test_schedule_errors_the_program_shows_come_before_any_measurement(
    tmp_path, matmul_file, capsys, ops, problem
):
    schedule = write_schedule(tmp_path / "s.json", ops)
    assert main(["measure", str(matmul_file), "--schedule", schedule, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no baseline was measured, nothing printed
    assert "Traceback" not in captured.err
    assert schedule in captured.err and problem in captured.err


def test_measure_with_threads_takes_the_heuristic_for_that_many_threads(matmul_file):
    def chosen(*options: str) -> Schedule:
        args = build_parser().parse_args(["measure", str(matmul_file), *options])
        return schedule_to_measure(args, load_program(matmul_file))[0]

    kinds = lambda schedule: {t.kind for o in schedule.ops for t in o.transforms}  # noqa: E731
    assert TILE_PARALLEL in kinds(chosen("--threads", "2"))
    assert TILE_PARALLEL not in kinds(chosen())
    assert chosen("--threads", "2") == heuristic_schedule(load_program(matmul_file), 2)


def collect_command(store, budget: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlirrl_jax.cli",
        "collect",
        "--store",
        str(store),
        "--rows",
        str(budget),
        "--workers",
        "1",
        "--max-programs",
        "1",
        "--max-mflops",
        "0.5",
    ]


def measurement_count(store) -> int:
    """Rows in the job's store; -1 before the job has made its store and tables."""
    if not store.exists():
        return -1
    try:
        with contextlib.closing(sqlite3.connect(store)) as db:
            return db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    except sqlite3.OperationalError:
        return -1


@pytest.mark.measures
@pytest.mark.parametrize("moment", ["start-up", "measuring"])
def test_ctrl_c_stops_a_collection_and_leaves_its_store_consistent(tmp_path, moment):
    store = tmp_path / "m.db"
    job = subprocess.Popen(
        collect_command(store, 50),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # start-up: the store is made, the programs are being loaded and the sampler built;
    # measuring: the baselines are committed and schedules are in flight
    least = 0 if moment == "start-up" else 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        if measurement_count(store) >= least:
            break
        time.sleep(0.02)
    assert job.poll() is None, job.communicate()
    job.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    out, err = job.communicate(timeout=30)
    assert time.monotonic() - interrupted < 20
    assert job.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
    assert "new rows" not in out  # it did not run on to its end
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with MeasurementStore(store, create=False) as opened:
        assert opened.summary()["measurements"] < 50


# fault injection: SIGINT sent by a thread that sees the main thread waiting on XLA's compile
CTRL_C_WHILE_COMPILING = """
import os, signal, sys, threading, time, traceback
import jax, jax.numpy as jnp
from mlirrl_jax.interrupt import stop_on_ctrl_c

def ctrl_c_once_compiling():
    while True:
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None and frame.f_code.co_name != "backend_compile_and_load":
            frame = frame.f_back
        if frame is not None:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.001)

@jax.jit
def large(x):
    for i in range(80):
        x = jnp.sin(x) * (i + 1.0) + jnp.cos(x[::-1])
    return x

threading.Thread(target=ctrl_c_once_compiling, daemon=True).start()
try:
    with stop_on_ctrl_c():
        large(jnp.ones(64)).block_until_ready()
except KeyboardInterrupt as stop:
    print("raised in", traceback.extract_tb(stop.__traceback__)[-1].name)
    sys.exit(130)
"""


def test_ctrl_c_while_jax_compiles_stops_when_the_compilation_ends_without_a_crash():
    # raised while XLA still compiled on its threads, the interrupt ended the interpreter under
    # them: a segmentation fault. Compiled for real, not loaded from the session's cache:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    job = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_COMPILING],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert job.returncode == 130, job.stderr[-3000:]
    assert job.stdout.strip() == "raised in check_stop"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed one
def test_a_ctrl_c_swallowed_in_a_gc_callback_still_stops_the_job():
    # fault injection: SIGINT arrives while a gc callback runs, as JAX's does; the callback's
    # KeyboardInterrupt is printed and dropped by the gc, never seen by the job
    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at one of these bytecodes
                pass

    sent: list[bool] = []
    gc.callbacks.append(callback)
    try:
        with stop_on_ctrl_c():
            gc.collect()  # returns: the interrupt was swallowed
            assert sent
            with pytest.raises(KeyboardInterrupt):
                check_stop()  # the job's next safe point stops it all the same
        check_stop()  # outside a job, nothing is pending
    finally:
        gc.callbacks.remove(callback)


def test_the_demo_fails_only_for_a_method_left_without_a_verified_result(caplog):
    from mlirrl_jax.demo import methods_without_result
    from mlirrl_jax.records import ValidationRow

    def row(random_status: str) -> ValidationRow:
        ms = 1.0 if random_status == "ok" else None
        return ValidationRow.from_json(
            {
                "program": "suite://dl-v0/relu_1x56x56x256",
                "kind": "elementwise",
                "threads": 1,
                "flops": 802816,
                "kernel_measurements": 3,
                "failed": ["timeout"],  # one random candidate timed out: a recorded result
                "failed_counts": {"timeout": 1},
                "unverified": 0,
                "methods": {
                    "heuristic": {"ms": 0.1, "spent": 0, "status": "ok"},
                    "random_k": {"ms": ms, "spent": 1, "status": random_status},
                    "numpy": {"ms": None, "spent": 0, "status": "not available for this program"},
                },
            }
        )

    assert methods_without_result([row("ok")]) == []
    assert "candidate schedules ended timeout" in caplog.text
    caplog.clear()
    missing = methods_without_result([row("no verified schedule")])
    assert missing == ["suite://dl-v0/relu_1x56x56x256 (random_k: no verified schedule)"]
    assert "no verified result: suite://dl-v0/relu_1x56x56x256" in caplog.text
