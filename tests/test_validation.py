"""The final validation and `optimize`, end to end with the shipped agent: real schedules,
real measurement in the worker, verified outputs, XLA beside them."""

import json
import shlex
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MATMUL, MATMUL_BIAS_RELU

from mlirrl_jax.cli import main
from mlirrl_jax.shipped import SHIPPED_AGENT

pytestmark = pytest.mark.skipif(
    not (SHIPPED_AGENT / "checkpoints").is_dir(), reason="no shipped agent in data/agent"
)

SMALL = dict(threads=(1,), budget=2, random_factor=2, guided_samples=8, timeout_s=60)


@pytest.fixture(scope="module")
def agent():
    from mlirrl_jax.agent.agent import Agent

    return Agent.load(SHIPPED_AGENT)


@pytest.fixture(scope="module")
def validated(agent, matmul, mm_bias_relu, tmp_path_factory):
    from mlirrl_jax.validation import Validation, ValidationConfig

    out = tmp_path_factory.mktemp("validation")
    store = out / "store.db"
    v = Validation(
        agent,
        [matmul, mm_bias_relu],
        out,
        # a strategy measured beside the default ones: one module, one `Method` member
        ValidationConfig(**SMALL, store=str(store), also="refined_topk"),
        agent_run=str(SHIPPED_AGENT),
    )
    rows = v.run()
    summary = v.report(rows, peak_gflops=100.0)
    return out, rows, summary, v


def test_validation_measures_every_method_on_every_program(validated):
    out, rows, summary, _ = validated
    assert [r.program for r in rows] == ["matmul", "mm_bias_relu"]
    for r in rows:
        methods = r.methods
        assert methods["unscheduled"].ms > 0
        for name in ("heuristic", "agent_greedy", "agent_topk", "random_k", "random_8k"):
            assert methods[name].ms and methods[name].ms > 0, (r.program, name)
        assert methods["agent_topk"].spent == 2 and methods["random_8k"].spent == 4
        assert methods["agent_greedy"].spent == 0
        assert methods["refined_topk"].ms > 0 and 1 <= methods["refined_topk"].spent <= 2
        # the larger random search includes the smaller one: never worse
        assert methods["random_8k"].ms <= methods["random_k"].ms
        # its trials, in the order measured: the sample-efficiency curve reads them
        trials = methods["random_8k"].trials_ms
        assert len(trials) == 4 and min(t for t in trials if t) == methods["random_8k"].ms
        assert methods["xla"].status == "ok" and methods["xla"].ms > 0
        assert not r.failed and r.unverified == 0
    assert rows[0].methods["numpy"].ms > 0  # a matmul: NumPy/BLAS too
    entry = summary["threads"]["1"]
    assert entry["agent_topk_over_random_8k"] > 0
    greedy = entry["methods"]["agent_greedy"]
    assert greedy["predicted_geomean"] > 0 and greedy["prediction_mape"] >= 0
    assert {"matmul", "matmul_bias_relu"} <= set(entry["by_kind"]) or entry["by_kind"]
    efficiency = summary["sample_efficiency"]["1"]["random_8k"]
    assert efficiency["programs"] == 2 and efficiency["budget"] == 4
    text = (out / "validation.md").read_text()
    assert "agent top-k" in text and "XLA:CPU" in text and "mlirrl-jax measure" in text
    assert "## Sample efficiency" in text and "agent top-k / heuristic" in text
    assert "predicted speedup (its rows' threads: 1) against real" in text
    for plot in (
        "validation_speedups.png",
        "validation_cdf.png",
        "validation_predicted.png",
        "validation_sample_efficiency.png",
    ):
        assert (out / plot).stat().st_size > 0
    saved = json.loads((out / "validation.json").read_text())
    assert saved["summary"]["machine_id"] and len(saved["rows"]) == 2


def test_a_deadline_cuts_the_programs_that_would_not_end_by_it(validated):
    from types import SimpleNamespace

    from mlirrl_jax.budget import TimeBudget

    v = validated[3]
    job = lambda name: (SimpleNamespace(program=SimpleNamespace(name=name)), 1)  # noqa: E731
    left = [job("suite://dl-v0/a"), job("b")]
    assert not v._out_of_time([], left)  # no deadline: nothing is cut
    v.budget, v.deadline = TimeBudget(60.0), time.time() + 100.0
    try:
        assert not v._out_of_time([], left)  # the first program always runs
        assert not v._out_of_time([20.0, 40.0], left)  # 30 s each, 100 s left
        v.deadline = time.time() + 20.0
        assert v._out_of_time([20.0, 40.0], left)
        (cut,) = v.budget.cuts
        assert cut.phase == "validation" and cut.what == "2 of 4 programs: a (1t), b (1t)"
    finally:
        v.budget = v.deadline = None


def test_the_report_counts_failed_candidates_beside_the_speedups(validated):
    from mlirrl_jax.validation import format_validation

    out, rows, summary, v = validated
    assert all(r.failed_counts == {} for r in rows)
    lines = (out / "validation.md").read_text().splitlines()
    assert any(line.endswith("| candidates failed |") for line in lines)
    # a candidate that timed out is a result of the run, counted in its program's row
    timed_out = [replace(rows[0], failed=["timeout"], failed_counts={"timeout": 1}), rows[1]]
    text = format_validation(timed_out, summary, v.config, {}, {})
    row = next(line for line in text.splitlines() if line.startswith("| matmul |"))
    assert row.endswith("| timeout 1 |") and "x |" in row


def test_validation_schedules_replay_with_measure(validated, capsys):
    out, rows, _, _ = validated
    path = out / "validation" / "schedules" / "mm_bias_relu" / "agent_topk-t1.json"
    assert path.is_file()
    program = out / "mm_bias_relu.mlir"
    program.write_text(MATMUL_BIAS_RELU)
    assert main(["measure", str(program), "--schedule", str(path), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)["scheduled"]
    assert replayed["verified"] and replayed["schedule"] == json.loads(path.read_text())


def test_validation_goes_on_where_it_stopped_and_stores_its_measurements(validated, agent):
    from mlirrl_jax.store import MeasurementStore
    from mlirrl_jax.validation import Validation, ValidationConfig, ValidationError

    out, rows, _, v = validated
    again = Validation(
        agent,
        v.programs,
        out,
        v.config,
        agent_run=str(SHIPPED_AGENT),
    )
    assert again.run() == rows  # everything done: nothing measured again
    with MeasurementStore(v.config.store) as store:
        # each distinct kernel schedule once, the unscheduled programs included
        assert store.count() == sum(r.kernel_measurements for r in rows)
    with pytest.raises(ValidationError, match="other settings"):
        Validation(agent, v.programs, out, ValidationConfig(**{**SMALL, "budget": 3}))


def test_every_printed_replay_command_runs_as_printed(validated, capsys):
    """The programs are the user's own (not suite URIs): each command names a file."""
    out, rows, _, _ = validated
    commands = [
        line.strip()
        for line in (out / "validation.md").read_text().splitlines()
        if line.strip().startswith("mlirrl-jax measure ")
    ]
    assert len(commands) == len(rows)  # the agent's top-k of each program
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
        assert "verified" in capsys.readouterr().out


def test_a_rerun_on_a_changed_program_is_refused_naming_both_hashes(validated, agent):
    """The same name, 16 times the FLOPs: its rows are not the old program's."""
    from mlirrl_jax.programs.ir import parse_program
    from mlirrl_jax.validation import Validation, ValidationError

    out, rows, _, v = validated
    assert [r.program_hash for r in rows] == [p.hash for p in v.programs]
    bigger = parse_program(MATMUL.replace("64x", "1024x"), "matmul")
    assert bigger.flops == 16 * v.programs[0].flops
    with pytest.raises(ValidationError) as caught:
        Validation(
            agent,
            [bigger, v.programs[1]],
            out,
            v.config,
            agent_run=str(SHIPPED_AGENT),
        )
    message = str(caught.value)
    assert "matmul" in message and "--out" in message and "\n" not in message
    assert v.programs[0].hash[:12] in message and bigger.hash[:12] in message


@pytest.mark.measures
def test_the_evolutionary_search_is_not_credited_with_the_heuristics_schedule(
    agent, matmul, runner
):
    """The heuristic's schedule, measured for its own method, is the search's known parent:
    not measured again, not among the search's trials, not its figure."""
    from mlirrl_jax.heuristics import heuristic_schedule
    from mlirrl_jax.strategies import Candidate, Method
    from mlirrl_jax.surrogate.api import CostModel
    from mlirrl_jax.validation import Plan, ValidationConfig
    from mlirrl_jax.validation.measure import measure_plan

    heuristic = heuristic_schedule(matmul, 1)
    plan = Plan(matmul, {Method.HEURISTIC: [Candidate(heuristic, 1.0)]})
    config = ValidationConfig(**SMALL, evolutionary_budget=1, xla=False, numpy=False)
    base = runner.measure(matmul, None)
    row = measure_plan(plan, 1, base, runner, config, None, CostModel.load(agent.surrogate.path))
    assert row.methods["heuristic"].schedule == heuristic.to_json()
    evolutionary = row.methods["evolutionary"]
    assert evolutionary.spent == 1 and len(evolutionary.trials_ms) == 1
    assert evolutionary.schedule != heuristic.to_json()
    assert row.kernel_measurements == 3  # unscheduled, heuristic, the search's one


def test_each_thread_count_takes_the_agent_adapted_to_it(tmp_path, monkeypatch, agent, matmul):
    from mlirrl_jax import adopted
    from mlirrl_jax.adopted import runs_for_threads
    from mlirrl_jax.validation import Validation, ValidationConfig, ValidationError, agents_line

    monkeypatch.setenv("MLIRRL_HOME", str(tmp_path / "home"))  # read at each call
    monkeypatch.setattr(adopted, "CHECKOUT_ADAPTED", tmp_path / "checkout-adapted")
    assert adopted.default_agent_run(2) == SHIPPED_AGENT  # nothing adapted here yet
    one, two = tmp_path / "one", tmp_path / "two"
    for run in (one, two):
        (run / "checkpoints").mkdir(parents=True)
    adopted.adopt_agent_run(one, 1)
    assert adopted.default_agent_run(2) == one.resolve()  # none at two: the one-thread one
    adopted.adopt_agent_run(two, 2)
    assert adopted.default_agent_run(1) == one.resolve()
    assert adopted.default_agent_run(2) == two.resolve()
    runs = runs_for_threads([], (1, 2), adopted.default_agent_run)
    assert runs == {1: one.resolve(), 2: two.resolve()}
    assert runs_for_threads([str(one)], (1, 2), None) == {1: one, 2: one}
    with pytest.raises(ValueError, match="both adapted at 1 thread"):
        runs_for_threads([str(SHIPPED_AGENT), str(SHIPPED_AGENT)], (1, 2), None)
    with pytest.raises(ValidationError, match=r"no agent for \[1\] thread"):
        Validation({2: agent}, [matmul], tmp_path / "v", ValidationConfig(**SMALL))
    line = agents_line(
        {
            "agent": {"1": "runs/a", "2": "runs/b"},
            "surrogate_machine": "m",
            "surrogate_threads": {"1": 1, "2": 2},
        }
    )
    assert (
        "1 thread(s): `runs/a`" in line
        and "2 thread(s): `runs/b` (surrogate of machine m at 2)" in line
    )


def test_validation_refuses_bad_settings():
    from mlirrl_jax.validation import ValidationConfig, ValidationError

    with pytest.raises(ValidationError, match="threads"):
        ValidationConfig(threads=(0,))
    with pytest.raises(ValidationError, match="budget"):
        ValidationConfig(budget=0)
    with pytest.raises(ValidationError, match="guided_samples"):
        ValidationConfig(budget=8, guided_samples=4)


@pytest.mark.measures
def test_optimize_a_hand_written_kernel_measuring_each_schedule_once(tmp_path, capsys):
    """With the evolutionary search after the agent: the heuristic's and the agent's schedules
    are its known parents, never measured again nor credited to it."""
    kernel = tmp_path / "mm.mlir"
    kernel.write_text(MATMUL)
    out = tmp_path / "out"
    search = ["--search", "evolutionary", "--search-budget", "1"]
    code = main(["optimize", str(kernel), "--out", str(out), "--budget", "2", *search])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    for key in ("baseline_ms", "heuristic_ms", "best_ms", "speedup", "verified", "measurements"):
        assert key in summary
    assert summary["verified"] and summary["measurements"] == 5  # base, heuristic, 2 agent, 1
    assert summary["best_ms"] <= summary["heuristic_ms"]
    rows = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()]
    sources = ["unscheduled", "heuristic", "agent 1", "agent 2", "evolutionary 1"]
    assert [r["source"].split(",")[0] for r in rows] == sources
    assert len({r["schedule_hash"] for r in rows}) == len(rows)
    from mlirrl_jax.records import OptimizeSummary

    typed = OptimizeSummary.from_json(summary)  # the file is the typed record, whole
    assert typed.to_json() == summary and typed.ranking[0].over_best == 1
    with pytest.raises(ValueError, match="unknown fields"):
        OptimizeSummary.from_json({**summary, "best": 1})
    assert "transform.named_sequence" in (out / "transform.mlir").read_text()
    transformed = (out / "transformed.mlir").read_text()
    assert "func.func @kernel" in transformed and "vector" in transformed
    assert json.loads((out / "schedule.json").read_text())["ops"]
    assert "replay: mlirrl-jax measure" in capsys.readouterr().out


def test_optimize_and_validate_refuse_bad_input_clearly(tmp_path, capsys):
    binary = tmp_path / "bin.mlir"
    binary.write_bytes(b"\x00\xff\xfe" * 10)
    assert main(["optimize", str(binary), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bin.mlir" in err and "Traceback" not in err
    assert main(["optimize", str(tmp_path / "missing.mlir"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.mlir" in capsys.readouterr().err
    kernel = tmp_path / "mm.mlir"
    kernel.write_text(MATMUL)
    with pytest.raises(SystemExit):  # argparse refuses it, naming the option
        main(["optimize", str(kernel), "--out", str(tmp_path / "o"), "--budget", "0"])
    assert "--budget: 0 must be > 0" in capsys.readouterr().err
    # more ops than the environment's tables hold
    from mlirrl_jax.env.state import MAX_OPS

    chain = _relu_chain(MAX_OPS + 1)
    big = tmp_path / "chain.mlir"
    big.write_text(chain)
    assert main(["optimize", str(big), "--out", str(tmp_path / "o")]) == 2
    assert "limits" in capsys.readouterr().err
    assert main(["validate", str(big), "--out", str(tmp_path / "v")]) == 2
    assert "limits" in capsys.readouterr().err
    assert main(["validate", "--suite", "dl-v0", str(kernel)]) == 2
    assert "not both" in capsys.readouterr().err
    assert not Path(tmp_path / "o" / "summary.json").exists()


def _relu_chain(ops: int) -> str:
    """A chain of `ops` element-wise ReLUs on a 4x8 tensor."""
    t = "tensor<4x8xf32>"
    lines = [
        "#id = affine_map<(i, j) -> (i, j)>",
        f"func.func @chain(%x0: {t}) -> {t} {{",
        "  %zero = arith.constant 0.0 : f32",
    ]
    for i in range(ops):
        lines += [
            f"  %e{i} = tensor.empty() : {t}",
            f"  %x{i + 1} = linalg.generic {{indexing_maps = [#id, #id], iterator_types = "
            f'["parallel", "parallel"]}} ins(%x{i} : {t}) outs(%e{i} : {t}) {{',
            "  ^bb0(%a: f32, %o: f32):",
            "    %m = arith.maximumf %a, %zero : f32",
            "    linalg.yield %m : f32",
            f"  }} -> {t}",
        ]
    lines += [f"  return %x{ops} : {t}", "}"]
    return "\n".join(lines)
