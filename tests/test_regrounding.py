"""Re-grounding with a real store and real measurements: a small run of two rounds at two
threads per kernel, started by the `train` command with a real budget below what its first
round would plan, killed with SIGKILL in the middle of its first round's measurements and
resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mlirrl_jax.agent.agent import Agent
from mlirrl_jax.agent.config import AgentConfig
from mlirrl_jax.agent.run import run_training
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.regrounding import RegroundConfig, rounds
from mlirrl_jax.shipped import SHIPPED_SURROGATE
from mlirrl_jax.store import MeasurementStore
from mlirrl_jax.surrogate.api import CostModel, predict_dataset
from mlirrl_jax.surrogate.dataset import load_dataset

REPO = Path(__file__).resolve().parents[1]
AGENT = AgentConfig(
    envs=32,
    steps=8,
    minibatches=2,
    devices=1,
    iterations=5,  # the train command replaces it: (rounds + 1) x 2, rounds after 2 and 4
    eval_every=0,
    checkpoint_seconds=0.0,
    suites=("dl-v0",),
)
ROUNDS = dict(
    rounds=2,
    iterations_per_round=2,
    round_programs=2,
    top_k=2,
    real_budget=20,  # round 1 alone would plan more: its validation and calibration are cut
    track_programs=1,
    heldout_programs=1,
    heldout_every=1,
    calibration_programs=2,
    validation_programs=2,
    validation_k=4,
    max_mflops=0.25,  # element-wise ops and small pools: quick to compile and run
    update_epochs=20,
    timeout_s=60.0,
    threads=2,  # the run adapts to two-thread kernels: every row it reads and writes is one
)


def _lines(path: Path) -> list:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run (`train` with no iteration budget), killed mid-measurement by SIGKILL, then
    resumed to its end in this process."""
    folder = tmp_path_factory.mktemp("regrounding")
    store, out = folder / "m.db", folder / "run"
    config_path, settings = folder / "agent.json", folder / "rounds.json"
    config_path.write_text(AGENT.dumps())
    settings.write_text(json.dumps(ROUNDS | {"store": str(store)}))
    command = [sys.executable, "-m", "mlirrl_jax.cli", "train", "--out", str(out)]
    process = subprocess.Popen(
        [*command, "--config", str(config_path), "--regrounding-config", str(settings)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    measured = out / "regrounding" / "measured.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and len(_lines(measured)) < 3 and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # mid-round, measurements in flight
    process.wait()
    killed_at = len(_lines(measured))
    assert killed_at >= 3, "the run never got to measuring"
    assert not (out / "regrounding" / "rounds.jsonl").is_file()  # round 1 had not ended
    summary = run_training(out, resume=True, regrounding=rounds(None))
    return {"out": out, "store": store, "killed_at": killed_at, "summary": summary}


def test_a_round_stores_exactly_what_it_measured_and_nothing_twice(run):
    here = machine_fingerprint()["machine_id"]
    folder = run["out"] / "regrounding"
    measured = [tuple(x) for x in _lines(folder / "measured.jsonl")]  # one line a measurement
    with MeasurementStore(run["store"]) as store:
        rows = list(store.rows(machine_id=here))
        assert store.machines() == {here}
    stored = {(r["program_hash"], r["schedule_hash"]) for r in rows}
    assert stored == set(measured)  # every measurement the run made is stored, and nothing else
    assert {r["threads"] for r in rows} == {2}
    assert all(r["n_measured"] == 1 for r in rows)  # nothing measured twice across the kill
    # the budget is a hard cap over both rounds and the kill, baselines included
    assert len(rows) <= len(measured) <= ROUNDS["real_budget"]
    state = json.loads((folder / "state.json").read_text())
    assert state["completed"] == 2 and state["spent"] == len(measured)
    planned = {}
    # round 2 gets what round 1 and the kill left (what a kill lost before its commit was
    # measured again, and counts): its learned schedules at least
    for round_, roles in ((1, {"track", "heldout", "heuristic"}), (2, set())):
        planned[round_] = json.loads((folder / f"round-{round_}" / "tasks.json").read_text())
        assert {t["role"] for t in planned[round_]} >= {"learn", "baseline", *roles}
        assert all(t["role"] != "calibration" for t in planned[round_]) or round_ == 1
    # nothing measured but what the rounds planned
    assert set(measured) <= {
        (t["program_hash"], t["schedule_hash"]) for t in sum(planned.values(), [])
    }
    rows_by_round = _lines(folder / "rounds.jsonl")
    assert [r["round"] for r in rows_by_round] == [1, 2]
    first = rows_by_round[0]
    # round 1 alone wanted more than the whole budget: it was cut, validation first, and says so
    assert first["wanted"] > ROUNDS["real_budget"]
    assert first["planned"] <= first["allowance"] < ROUNDS["real_budget"]
    assert first["cut"]["validation"] > 0 and "learn" not in first["cut"]
    assert first["on_policy_before"]["rows"] > 0 and first["real_track_geomean"] > 0
    # K iterations before each round and K after the last
    iterations = (ROUNDS["rounds"] + 1) * ROUNDS["iterations_per_round"]
    assert run["summary"]["iterations"] == iterations
    lines = _lines(run["out"] / "metrics.jsonl")
    assert [m["iteration"] for m in lines] == list(range(1, iterations + 1))


def test_the_update_keeps_the_rounds_schedules_learnt(run):
    here = machine_fingerprint()["machine_id"]
    folder = run["out"] / "regrounding"
    planned = json.loads((folder / "round-1" / "tasks.json").read_text())
    held = set(_lines(folder / "rounds.jsonl")[0]["held_back"])
    # the round's schedules the update learnt from (the held-back programs' are scored apart;
    # later rounds may measure the same programs again, and round 1's update never saw those)
    learnt = [t for t in planned if t["role"] == "learn" and t["program"] not in held]
    hashes = {t["program_hash"] for t in learnt}
    assert hashes
    prior = CostModel.load(SHIPPED_SURROGATE)
    updated = CostModel.load(folder / "round-1" / "surrogate")
    if _lines(folder / "rounds.jsonl")[0]["update_refused"]:  # the prior kept (tested below)
        assert updated.identity["params_sha256"] == prior.identity["params_sha256"]
        return
    with MeasurementStore(run["store"]) as store:
        data = load_dataset(store, here, threads=2, programs=hashes)
    mine = {(t["program_hash"], t["schedule_hash"]) for t in learnt}
    keep = [
        i
        for i in range(len(data))
        if data.is_baseline[i]
        or (data.programs[data.program[i]].hash, data.schedule_hash[i]) in mine
    ]
    data = data.subset(np.asarray(keep))
    assert (~data.is_baseline).any()
    errors = [
        np.mean(np.abs(predict_dataset(model, data) - data.log_time)) for model in (prior, updated)
    ]
    # the rows stay learnt: a broken update (wrong labels, weights restarted) lands far above
    # the prior. This round's update is ten Adam steps on a dozen two-thread rows of
    # microsecond kernels and their anchors, and need not lower the error (measured: 0.074 ->
    # 0.028 on one machine, 0.042 -> 0.047 and 0.205 -> 0.249 on others); what updates of
    # real size learn is measured by the re-grounding runs in bench/results/history.md.
    assert errors[1] < max(1.5 * errors[0], 0.1), errors
    # the updated surrogate names its lineage: the prior, and this machine's rows
    assert updated.meta["prior"]["params_sha256"] == prior.identity["params_sha256"]
    step = updated.lineage[-1]
    assert step["step"] == "update" and step["machine_id"] == here and step["rows"] > 0
    assert updated.meta["machine_id"] == here
    assert step["threads"] == 2 and updated.identity["threads"] == 2


def test_no_round_keeps_an_update_that_made_the_held_back_error_grow(run):
    folder = run["out"] / "regrounding"
    previous = CostModel.load(SHIPPED_SURROGATE).identity["params_sha256"]
    rows = _lines(folder / "rounds.jsonl")
    assert rows
    for row in rows:
        saved = CostModel.load(folder / f"round-{row['round']}" / "surrogate")
        before, after = row["held_back_before"], row["held_back_after"]
        if row["update_refused"]:  # the previous weights, and why
            assert saved.identity["params_sha256"] == previous
            assert "grew" in row["refusal"]
            assert after["mape_speedup"] > before["mape_speedup"]
        else:
            if "update_rows" in row:  # an update ran, and was kept
                assert saved.identity["params_sha256"] != previous
            if before and after:
                assert after["mape_speedup"] <= before["mape_speedup"]
        previous = saved.identity["params_sha256"]


def test_an_update_is_refused_only_when_its_held_back_error_grew():
    from mlirrl_jax.regrounding import update_refusal

    assert update_refusal({"mape_speedup": 0.2}, {"mape_speedup": 0.3}) == (
        "held-back MAPE of speedup grew from 20.0% to 30.0%"
    )
    assert update_refusal({"mape_speedup": 0.3}, {"mape_speedup": 0.3}) is None
    assert update_refusal({"mape_speedup": 0.3}, {"mape_speedup": 0.1}) is None
    # nothing to judge by: kept
    assert update_refusal(None, {"mape_speedup": 0.3}) is None
    assert update_refusal({"mape_speedup": float("nan")}, {"mape_speedup": 0.3}) is None


def test_a_round_measures_first_where_the_surrogate_claims_much_and_is_unsure():
    from mlirrl_jax.env.replay import state_of_schedule
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.programs import suites
    from mlirrl_jax.programs.ir import load_program
    from mlirrl_jax.regrounding import uncertain_gain_order

    gain = np.array([0.5, 0.2, -0.1, 0.3, -0.4, 0.0])
    spread = np.array([0.01, 0.5, 0.9, 0.1, 0.9, 0.9])
    # claims 0.005, 0.1, 0, 0.03, 0, 0: by claim, then the programs claiming nothing by gain
    assert uncertain_gain_order(gain, spread).tolist() == [1, 3, 0, 5, 2, 4]
    # the shipped surrogate is an ensemble: its spread on real schedules is there to rank by
    agent = Agent.load(REPO / "data" / "agent")
    programs = [load_program(e.uri) for e in suites.split("dl-v0", "test")[:3]]
    evaluator = agent.evaluator(programs, 1)
    states = [
        state_of_schedule(p, heuristic_schedule(p)).to_env_state(i) for i, p in enumerate(programs)
    ]
    spreads = evaluator.spread_states(evaluator.prepare(agent.surrogate.params), states)
    assert spreads.shape == (3,) and np.all(np.isfinite(spreads)) and np.all(spreads > 0)


def test_timing_and_jax_work_never_overlap(run):
    folder = run["out"] / "regrounding"
    phases = _lines(folder / "phases.jsonl")
    measuring = [(p["start"], p["end"]) for p in phases if p["phase"] == "measure"]
    jax_work = [(p["start"], p["end"]) for p in phases if p["phase"] != "measure"]
    iterations = _lines(run["out"] / "metrics.jsonl")
    jax_work += [(m["ended_at"] - m["iteration_seconds"], m["ended_at"]) for m in iterations]
    assert measuring and len(jax_work) > len(iterations) > 0
    for start, end in measuring:
        for other_start, other_end in jax_work:
            assert end <= other_start or other_end <= start, (start, end, other_start, other_end)


def test_the_resumed_agent_loads_with_its_own_surrogate(run):
    agent = Agent.load(run["out"])
    own = run["out"] / "regrounding" / "round-2" / "surrogate"
    assert Path(agent.surrogate.path) == own.resolve()
    assert agent.surrogate.machine_id == machine_fingerprint()["machine_id"]
    assert agent.surrogate.threads == 2


def test_the_rounds_heuristic_is_the_one_of_their_thread_count(run):
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.programs.ir import load_program

    planned = json.loads((run["out"] / "regrounding" / "round-1" / "tasks.json").read_text())
    heuristic = [t for t in planned if t["role"] == "heuristic"]
    assert heuristic
    for t in heuristic:
        assert t["schedule_hash"] == heuristic_schedule(load_program(t["program"]), 2).hash


def test_regrounding_settings_are_checked():
    with pytest.raises(ValueError, match="selection"):
        RegroundConfig(selection="best")
    with pytest.raises(ValueError, match="held_back"):
        RegroundConfig(held_back=1.0)
    with pytest.raises(ValueError, match="unknown re-grounding keys"):
        RegroundConfig.from_json({"round": 3})


def test_the_train_commands_regrounding_settings(tmp_path):
    from mlirrl_jax.cli import build_parser
    from mlirrl_jax.cli.regrounding import regrounding_from_flags as _rounds

    def parsed(*extra):
        return build_parser().parse_args(["train", "--out", str(tmp_path / "run"), *extra])

    assert _rounds(parsed()) is None  # simulated training only
    with pytest.raises(ValueError, match="--top-k: re-grounding needs rounds > 0"):
        _rounds(parsed("--top-k", "3"))
    with pytest.raises(ValueError, match="keeps its re-grounding settings: drop --rounds"):
        _rounds(parsed("--resume", "--rounds", "2"))
    settings = tmp_path / "rounds.json"
    settings.write_text(json.dumps({"rounds": 3, "calibration_k": 4, "top_k": 5}))
    chosen = _rounds(parsed("--regrounding-config", str(settings), "--top-k", "2")).config
    assert (chosen.rounds, chosen.calibration_k, chosen.top_k) == (3, 4, 2)  # flags win
    settings.write_text(json.dumps({"rounds": 3, "calibraton_k": 4}))
    with pytest.raises(ValueError, match="unknown re-grounding keys"):
        _rounds(parsed("--regrounding-config", str(settings)))


def test_a_plan_over_its_allowance_is_cut_in_order(kernel_programs):
    from mlirrl_jax.regrounding import CUT_ORDER, Planned, within_budget
    from mlirrl_jax.schedule import Schedule, Transform

    a, b, c, d, e, f = kernel_programs[:6]

    def tiled(size: int) -> Schedule:
        return Schedule.of({0: [Transform("tile", sizes=(size,))]})

    plan = [
        Planned(e, tiled(1), "calibration"),  # greedy, then a random one
        Planned(e, tiled(2), "calibration"),
        Planned(f, tiled(1), "validation"),
        Planned(f, tiled(2), "validation"),
        *(Planned(a, tiled(n), "learn") for n in (1, 2, 3)),  # the agent's best first
        *(Planned(b, tiled(n), "learn") for n in (1, 2)),
        Planned(b, tiled(1), "track"),  # also learned: free once that is kept
        Planned(c, tiled(1), "track"),
        Planned(d, tiled(1), "heldout"),
        Planned(d, tiled(2), "heuristic"),
        *(Planned(p, Schedule(), "baseline") for p in (e, f, a, b, c, d)),
    ]
    stored = {(a.hash, tiled(1).hash), (a.hash, Schedule().hash)}  # cost nothing

    def cut(allowance: int) -> tuple[set, dict]:
        kept, record = within_budget(plan, stored, allowance)
        new = {p.key for p in kept} - stored
        assert len(new) == record["planned"] <= allowance and record["wanted"] == 16
        return {(p.program.name, p.schedule.hash, p.role) for p in kept}, record

    kept, record = cut(16)
    assert len(kept) == len(plan) and record["cut"] == {}
    # 8 left: the learned (5 new) and the tracked (2) stay; a held-out schedule and its
    # baseline would need 2 more; what is cut goes with its program's baseline
    kept, record = cut(8)
    assert {role for *_, role in kept} == {"learn", "track", "baseline"}
    assert record["cut"] == {
        "validation": 2,
        "calibration": 2,
        "heuristic": 1,
        "heldout": 1,
        "baseline": 3,
    }
    # 3 left: each program's best learned schedules first, the lowest ranked cut
    kept, record = cut(3)
    assert {(n, r) for n, _, r in kept if r != "baseline"} == {
        (a.name, "learn"),
        (b.name, "learn"),
        (b.name, "track"),
    }
    assert sum(1 for _, h, r in kept if r == "learn") == 3  # a's 1 and 2, b's 1
    assert record["cut"]["learn"] == 2 and record["cut"]["track"] == 1
    assert set(CUT_ORDER) | {"baseline"} >= {p.role for p in plan}


def test_the_iterations_reach_every_round():
    chosen = RegroundConfig(rounds=2, iterations_per_round=10)
    assert chosen.run_iterations() == 30  # K before each round, K after the last
    chosen.check_iterations(21)  # the last round comes after iteration 20
    chosen.check_iterations(0)  # a time budget
    with pytest.raises(ValueError, match="reaches 1 of the 2 .* give --iterations 21 or more"):
        chosen.check_iterations(20)


def test_a_deadline_skips_a_round_and_cuts_measuring_and_says_so(run):
    from dataclasses import replace

    from mlirrl_jax.agent.run import load_programs
    from mlirrl_jax.agent.surrogate import load_surrogate
    from mlirrl_jax.budget import TimeBudget
    from mlirrl_jax.regrounding import Planned
    from mlirrl_jax.regrounding.measure import MIN_MEASURE_S
    from mlirrl_jax.schedule import Schedule, Transform
    from mlirrl_jax.splits import TRAIN

    budget = TimeBudget(600.0)
    job = rounds(None, budget, deadline=time.time() + 3600)(
        run["out"],
        True,
        AGENT,
        load_programs(TRAIN, ("dl-v0",)),
        load_surrogate(str(SHIPPED_SURROGATE)),
    )
    measurer = job.measurer
    took = measurer.phase_seconds()
    assert [len(took[p]) for p in ("choose", "measure", "update")] == [2, 2, 2]
    needs = took["choose"][1] + MIN_MEASURE_S + took["update"][1]
    assert measurer.round_needs_s() == pytest.approx(needs)
    # one more round, with measurements to spare: due while the time lasts, not after
    job.config = measurer.config = replace(job.config, rounds=3, real_budget=10_000)
    third = 3 * job.config.iterations_per_round
    assert job.due(third) and not budget.cuts
    measurer.deadline = time.time() + needs / 2
    assert not job.due(third)
    assert [(c.phase, c.what) for c in budget.cuts] == [("re-grounding", "round 3 of 3")]
    # measuring past its deadline starts nothing, and every measurement left out is counted
    program = job.pools.pool[-1]
    planned = [
        Planned(program, Schedule.of({0: [Transform("tile", sizes=(n,))]}), "learn") for n in (3, 5)
    ]
    spent = measurer.spent()
    report = measurer.measure(planned, deadline=time.time() - 1.0)
    assert report.measured == 0 and report.time_cut >= 2 and measurer.spent() == spent
    assert budget.cuts[-1].phase == "re-grounding" and "measurements" in budget.cuts[-1].what
