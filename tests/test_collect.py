"""The collection job: resumes after kill -9 without loss or duplicates; failures are data."""

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from mlirrl_jax.collect import CollectConfig, CollectionJob, parse_mix
from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.schedule import Schedule

QUICK = TimingMethod(min_repeats=2, min_time_s=0.01)


def command(store, budget, workers=2, *options):
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
        str(workers),
        "--max-mflops",
        "0.5",
        "--seed",
        "5",
        *options,
    ]


def rows(store):
    with sqlite3.connect(store) as db:
        return {
            (r[0], r[1], r[2], r[3]): (r[4], r[5])
            for r in db.execute(
                "SELECT program_hash, schedule_hash, machine_id, threads, status, median_s "
                "FROM measurements"
            )
        }


def stored(store):
    """How many rows the store holds; 0 before the job has created its tables."""
    try:
        return len(rows(store)) if store.exists() else 0
    except sqlite3.OperationalError:  # the file is there, its tables not yet
        return 0


def duplicates(store):
    with sqlite3.connect(store) as db:
        return db.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM measurements GROUP BY program_hash, "
            "schedule_hash, machine_id, threads HAVING COUNT(*) > 1)"
        ).fetchone()[0]


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_loses_and_duplicates_nothing(tmp_path):
    store = tmp_path / "m.db"
    job = subprocess.Popen(
        command(store, 40),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if stored(store) >= 12:
            break
    os.killpg(job.pid, signal.SIGKILL)  # the job and its measurement workers, mid-flight
    job.wait()
    before = rows(store)
    assert len(before) >= 12
    result = subprocess.run(command(store, 40), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    after = rows(store)
    assert set(before) <= set(after)  # nothing committed was lost
    assert duplicates(store) == 0
    for key, (status, _) in before.items():
        assert after[key][0] == status
    assert "rows for the train split" in result.stdout
    assert int(result.stdout.split(" rows for the train split")[0].split()[-1]) == 40


@pytest.mark.slow
def test_injected_failures_are_stored_with_their_reason_and_the_job_goes_on(tmp_path):
    # the faults are injected on purpose into the first sampled measurements
    config = CollectConfig(
        store=tmp_path / "f.db",
        budget=12,
        workers=2,
        max_mflops=0.5,
        max_programs=8,
        baselines_of=("train",),
        # the hang's limit: it bounds the kernel's run (compiling and the reference have limits
        # of their own)
        timeout_s=10,
        method=QUICK,
        inject_faults=("crash", "hang", "wrong_output"),
    )
    report = CollectionJob(config).run()
    statuses = {status for status, _ in rows(config.store).values()}
    assert {"crash", "timeout", "wrong_output", "ok"} <= statuses
    assert report.stored_for_split == 12 and report.failures == 3
    with sqlite3.connect(config.store) as db:
        failed = db.execute(
            "SELECT status, error, median_s FROM measurements WHERE status != 'ok'"
        ).fetchall()
    assert all(error and median is None for _, error, median in failed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ray_backend_against_a_local_ray_instance(tmp_path):
    pytest.importorskip("ray", reason="install mlirrl-jax[cluster] for the Ray backend")
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    start = subprocess.run(
        [
            ray_bin,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        config = CollectConfig(
            store=tmp_path / "r.db",
            budget=6,
            workers=2,
            max_mflops=0.5,
            max_programs=4,
            baselines_of=("train",),
            backend="ray",
            address=f"127.0.0.1:{port}",
            method=QUICK,
        )
        report = CollectionJob(config).run()
        assert report.stored_for_split == 6 and report.failures == 0
        assert all(status == "ok" for status, _ in rows(config.store).values())
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_rerun_fast_forwards_past_more_stored_schedules_than_the_exhaustion_limit(tmp_path):
    # one program: the sampler gives up after 50 draws in a row that the store already has;
    # a rerun over 60 stored schedules must not take its fast-forward for exhaustion
    def config(budget):
        return CollectConfig(
            store=tmp_path / "e.db",
            budget=budget,
            workers=2,
            max_mflops=0.5,
            max_programs=1,
            baselines_of=("train",),
            method=QUICK,
        )

    first = CollectionJob(config(60)).run()
    assert first.stored_for_split == 60
    again = CollectionJob(config(66)).run()
    assert again.stored_for_split == 66 and again.new_rows == 6
    assert duplicates(tmp_path / "e.db") == 0


@pytest.mark.slow  # each process compiles its schedule samplers: 30 s to 80 s on 2 cores
def test_two_jobs_on_one_store_share_the_work_and_never_measure_a_schedule_twice(tmp_path):
    # two real processes, the same seed (they draw the same schedules), started together
    store = tmp_path / "shared.db"
    jobs = [
        subprocess.Popen(
            command(store, 6, 1, "--max-programs", "3", "--next-weight", "1", "--timeout", "10"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [job.communicate(timeout=300) for job in jobs]
    for job, (_, err) in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, err[-2000:]
    measured = [int(out.split("measured ")[1].split()[0]) for out, _ in outputs]
    skipped = [int(out.split(" skipped (claimed")[0].split()[-1]) for out, _ in outputs]
    with sqlite3.connect(store) as db:
        counts = [n for (n,) in db.execute("SELECT n_measured FROM measurements")]
        claims = db.execute("SELECT COUNT(*) FROM claims").fetchone()[0]
    assert counts and set(counts) == {1}  # no schedule was measured by both
    assert len(counts) == sum(measured)  # every measurement a row of its own
    assert sum(skipped) > 0  # drawing the same schedules, they left each other's alone
    assert claims == 0  # released as the results were stored
    # they ran at the same time, and the one that saw the other said so, naming its pid
    warned = [
        f"another job (pid {other.pid})" in err
        for other, (_, err) in zip(reversed(jobs), outputs, strict=True)
    ]
    assert any(warned)


def test_schedules_come_per_visit_in_a_row_of_each_program(tmp_path):
    # after the baselines, each program gets `per_visit` sampled schedules in a row, so that a
    # worker computes its reference outputs once per visit; every program is visited
    job = CollectionJob(
        CollectConfig(
            store=tmp_path / "v.db",
            budget=1,
            max_mflops=0.5,
            max_programs=5,
            baselines_of=("train",),
            per_visit=3,
        )
    )
    tasks = job.tasks()
    baselines = [next(tasks) for _ in job.programs]
    assert all(t.schedule.is_empty for t in baselines)
    sampled = [next(tasks).program.name for _ in range(3 * len(job.programs))]
    runs = [sampled[i : i + 3] for i in range(0, len(sampled), 3)]
    assert all(len(set(run)) == 1 for run in runs)
    assert {run[0] for run in runs} == {p.name for p in job.programs}
    job.store.close()


def test_a_schedule_mix_names_its_sources_and_shares():
    assert parse_mix("random:0.4, heuristic:0.4,agent:0.2") == (
        ("random", 0.4),
        ("heuristic", 0.4),
        ("agent", 0.2),
    )
    assert parse_mix("heuristic") == (("heuristic", 1.0),)
    for bad, words in [
        ("random:0.5,search:0.5", "unknown schedule source 'search'"),
        ("random:x", "not a number"),
        ("random:0", "must be finite and positive, got 0.0"),
        (" , ", "names no schedule source"),
        ("", "names no schedule source"),
        ("random:inf,heuristic:1", "share of 'random' must be finite and positive, got inf"),
        ("random:1,agent:nan", "share of 'agent' must be finite and positive, got nan"),
        ("random:-1", "share of 'random' must be finite and positive"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_mix(bad)


def test_a_job_refuses_a_mix_whose_shares_do_not_make_probabilities(tmp_path):
    for mix in [(("random", float("inf")), ("heuristic", 1.0)), (), (("search", 1.0),)]:
        config = CollectConfig(store=tmp_path / "m.db", budget=1, mix=mix)
        with pytest.raises(ValueError, match="--mix"):
            CollectionJob(config)
    assert not (tmp_path / "m.db").exists()


def _sampled(tmp_path, mix, count, name):
    job = CollectionJob(
        CollectConfig(
            store=tmp_path / f"{name}.db",
            budget=1,
            max_mflops=0.5,
            max_programs=3,
            baselines_of=("train",),
            mix=mix,
        )
    )
    try:
        tasks = job.tasks()
        for _ in job.programs:
            assert next(tasks).schedule.is_empty  # the baselines come first
        return job.programs, [next(tasks) for _ in range(count)]
    finally:
        job.store.close()


def test_the_heuristic_source_measures_its_schedule_then_mutations_around_it(tmp_path):
    programs, tasks = _sampled(tmp_path, (("heuristic", 1.0),), 24, "h")
    own = {p.hash: heuristic_schedule(p).hash for p in programs}
    firsts = {}
    for task in tasks:
        firsts.setdefault(task.program.hash, task.schedule.hash)
    # each program's first schedule is the heuristic's own, unless that is the empty schedule
    # (elementwise ops: measured as the baseline)
    scheduled = {h for h, s in own.items() if s != Schedule().hash}
    assert scheduled and {h: firsts[h] for h in scheduled} == {h: own[h] for h in scheduled}

    def shared(schedule, program):
        steps = {
            (o["op"], json.dumps(t)) for o in schedule.to_json()["ops"] for t in o["transforms"]
        }
        ref = heuristic_schedule(program).to_json()["ops"]
        return len(steps & {(o["op"], json.dumps(t)) for o in ref for t in o["transforms"]})

    mutated = [t for t in tasks if t.schedule.hash != own[t.program.hash]]
    assert len(mutated) == len(tasks) - len(scheduled)
    _, randoms = _sampled(tmp_path, (("random", 1.0),), len(mutated), "r")
    near = np.mean([shared(t.schedule, t.program) for t in mutated])
    far = np.mean([shared(t.schedule, t.program) for t in randoms])
    assert near > 2 * far  # mutations keep most of the heuristic's transforms


def test_the_agent_source_draws_the_trained_agents_schedules(tmp_path):
    _, tasks = _sampled(tmp_path, (("agent", 1.0),), 6, "a")
    assert all(not t.schedule.is_empty for t in tasks)
    # distinct per program (two programs may share a schedule: relus of two shapes)
    assert len({(t.program.hash, t.schedule.hash) for t in tasks}) == len(tasks)
