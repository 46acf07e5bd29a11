"""The command line, run as a user would run it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlirrl_jax.cli import main
from tests.conftest import MATMUL


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlirrl_jax.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.measures
def test_measure_a_file_with_a_schedule(tmp_path):
    program = tmp_path / "mm.mlir"
    program.write_text(MATMUL)
    schedule = tmp_path / "s.json"
    schedule.write_text(
        json.dumps(
            {
                "ops": [
                    {
                        "op": 1,
                        "transforms": [
                            {"kind": "tile", "sizes": [8, 32, 1]},
                            {"kind": "vectorize"},
                        ],
                    }
                ]
            }
        )
    )
    result = run_cli("measure", str(program), "--schedule", str(schedule))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "baseline :" in out and "speedup  :" in out and "GFLOP/s  :" in out
    assert "verified : True" in out


@pytest.mark.measures
def test_measure_json_and_threads():
    result = run_cli("measure", "suite://dl-v0/relu_1x56x56x64", "--threads", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["scheduled"]["status"] == "ok" and data["scheduled"]["threads"] == 2
    assert data["baseline"]["verified"]


def test_bad_inputs_give_clear_errors(tmp_path, capsys):
    assert main(["measure", str(tmp_path / "missing.mlir")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["measure", "suite://dl-v0/matmul_m256_n256_k99"]) == 2
    assert "suite://dl-v0/matmul_m256_n256_k99" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    program = tmp_path / "mm.mlir"
    program.write_text(MATMUL)
    assert main(["measure", str(program), "--schedule", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_demo_refuses_a_folder_that_holds_an_agent_run(tmp_path, capsys):
    # the demo itself (minutes of re-grounding, training and validation) is run and timed by
    # hand (bench/results/history.md); its parts are tested in test_regrounding and test_validation
    (tmp_path / "agent" / "checkpoints").mkdir(parents=True)
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "already holds an agent run" in capsys.readouterr().err


@pytest.mark.measures
def test_optimize_goes_on_when_the_unscheduled_run_is_over_the_limit(tmp_path, capsys, monkeypatch):
    from mlirrl_jax.measure.refcache import CACHE_ENV
    from mlirrl_jax.programs import generate as g

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "reference"))
    kernel = tmp_path / "mm768.mlir"  # unscheduled ~0.8 s a run, six runs; scheduled ~15 ms
    kernel.write_text(g.render(g.MatmulSpec(768, 768, 768)))
    out = tmp_path / "out"
    code = main(["optimize", str(kernel), "--out", str(out), "--budget", "2", "--timeout", "1.5"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline_ms"] is None and summary["speedup"] is None
    assert "exceeded the 1.5 s limit" in summary["baseline_note"]
    assert summary["verified"] and summary["best_ms"] < 1500
    ranking = summary["ranking"]
    assert [r["ms"] for r in ranking] == sorted(r["ms"] for r in ranking)
    assert ranking[0]["source"] == summary["best_source"] and ranking[0]["over_best"] == 1
    assert all(r["speedup"] is None for r in ranking)
    rows = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()]
    assert rows[0]["source"] == "unscheduled" and rows[0]["status"] == "timeout"
    assert rows[0]["error"].startswith("kernel run (first call and timing) not done within 1.5 s")
    assert "unscheduled over the 1.5 s limit" in printed.out
    # the shipped agent's surrogate (nothing is adapted in the tests' data folder) is warned of
    # where it was not fitted on this machine
    from mlirrl_jax.adopted import default_agent_run
    from mlirrl_jax.measure.fingerprint import machine_fingerprint
    from mlirrl_jax.shipped import SHIPPED_AGENT, SHIPPED_SURROGATE

    assert default_agent_run(1) == SHIPPED_AGENT
    machines = json.loads((SHIPPED_SURROGATE / "model.json").read_text())["machines"]
    here = machine_fingerprint()["machine_id"]
    assert (f"this machine ({here}) is not among" in printed.err) == (here not in machines)


@pytest.mark.measures
def test_the_readmes_python_runs_as_written(capsys, monkeypatch):
    root = Path(__file__).resolve().parents[1]
    code = re.search(r"```python\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(root)  # its paths are the checkout's, as the README's reader runs it
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and all("x predicted" in line and line.endswith(" ms") for line in lines)
    assert any(line.startswith("heuristic: ") for line in lines)  # the known start's proposals
