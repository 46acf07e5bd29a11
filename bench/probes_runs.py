"""Probes of `validate`, the surrogate's integrity and the searches (`probes.py` runs them): each
case reproduces a reported defect's recipe through real `mlirrl-jax` processes."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 240

MATMUL = """
func.func @matmul(%A: tensor<64x128xf32>, %B: tensor<128x96xf32>) -> tensor<64x96xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x96xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<64x96xf32>) -> tensor<64x96xf32>
  %r = linalg.matmul ins(%A, %B : tensor<64x128xf32>, tensor<128x96xf32>)
                     outs(%init : tensor<64x96xf32>) -> tensor<64x96xf32>
  return %r : tensor<64x96xf32>
}
"""
# the smallest validation: one thread, one measurement per method, no XLA
SMALL_VALIDATION = ["--threads", "1", "--budget", "1", "--random-factor", "1"]
SMALL_VALIDATION += ["--guided-samples", "1", "--no-xla"]


def _run(args: list[str], shown: str) -> tuple[subprocess.CompletedProcess, str]:
    """A real process from the repository's root, and the command as a user types it."""
    done = subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    return done, shown


def cli(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    return _run([sys.executable, "-m", "mlirrl_jax.cli", *args], shlex.join(["mlirrl-jax", *args]))


def python(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    return _run([sys.executable, *args], shlex.join(["python", *args]))


def said(done: subprocess.CompletedProcess, *needles: str) -> str:
    """The exit status and the last line of stderr (or of the lines holding `needles`)."""
    lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.strip()]
    telling = [line for line in lines if any(n in line for n in needles)] if needles else []
    return f"exit {done.returncode}: {(telling or lines or [''])[-1].strip()[:300]}"


def kernel(out: Path, text: str = MATMUL) -> Path:
    path = out / "k.mlir"
    path.write_text(text)
    return path


def changed_program_refused(out: Path) -> dict:
    """2: a kernel edited to 16x its FLOPs, validated again into the same --out."""
    from mlirrl_jax.programs.ir import load_program

    path, report = kernel(out), out / "v"
    first, command = cli("validate", str(path), "--out", str(report), *SMALL_VALIDATION)
    old = load_program(path).hash
    path.write_text(MATMUL.replace("64x", "1024x"))
    new = load_program(path).hash
    second, again = cli("validate", str(path), "--out", str(report), *SMALL_VALIDATION)
    held = (
        first.returncode == 0
        and second.returncode == 2
        and old[:12] in second.stderr
        and new[:12] in second.stderr
        and "--out" in second.stderr
        and "Traceback" not in second.stderr
    )
    return {
        "command": f"{command}; (k.mlir edited: 16x the FLOPs); {again}",
        "expected": "the rerun is refused in one line naming the program, both hashes and "
        "another --out; no old measurement is reported as the new kernel's",
        "got": f"first {said(first)}; rerun {said(second, 'error')}",
        "held": held,
    }


def replay_commands_run(out: Path) -> dict:
    """11: each replay command `validate` prints for a user's file, run as printed."""
    report = out / "v"
    first, command = cli("validate", str(kernel(out)), "--out", str(report), *SMALL_VALIDATION)
    text = (report / "validation.md").read_text() if first.returncode == 0 else ""
    printed = [
        line.strip() for line in text.splitlines() if line.strip().startswith("mlirrl-jax measure")
    ]
    results = [cli(*shlex.split(line)[1:]) for line in printed]
    held = bool(printed) and all(done.returncode == 0 for done, _ in results)
    return {
        "command": "; ".join([command, *(shown for _, shown in results)]),
        "expected": "every printed `mlirrl-jax measure` command runs as printed and verifies",
        "got": f"validate {said(first)}; {len(printed)} printed; "
        + "; ".join(said(done, "verified", "error") for done, _ in results),
        "held": held,
    }


INJECT_NAN = """
import jax, numpy as np, shutil, sys
from mlirrl_jax.surrogate.api import CostModel
copy, scratch = sys.argv[1:]
model = CostModel.load(copy)
CostModel(model.graphdef, jax.tree.map(lambda a: a * np.nan, model.params), model.meta).save(scratch)
shutil.rmtree(copy + "/checkpoint")
shutil.copytree(scratch + "/checkpoint", copy + "/checkpoint")
"""


def damaged_surrogate_refused(out: Path) -> dict:
    """5: a surrogate copy's weights damaged to NaN, sealed without and with --force, trained
    against."""
    copy = out / "surrogate"
    shutil.copytree(ROOT / "data" / "cost_model_multi", copy)
    # the fault injected: NaN weights saved over the copy's checkpoint
    injected, _ = python("-c", INJECT_NAN, str(copy), str(out / "nan"))
    refused, seal = python("-m", "mlirrl_jax.integrity", "seal", str(copy))
    forced, force = python("-m", "mlirrl_jax.integrity", "seal", "--force", str(copy))
    trained, train = cli(
        "train", "--surrogate", str(copy), "--out", str(out / "run"), "--iterations", "1"
    )
    held = (
        injected.returncode == 0
        and refused.returncode == 2
        and "checkpoint/" in refused.stderr
        and "--force" in refused.stderr
        and forced.returncode == 0
        and "anew: " in forced.stdout
        and trained.returncode == 2
        and "NaN or infinite" in trained.stderr
        and "Traceback" not in trained.stderr
    )
    return {
        "command": f"cp -r data/cost_model_multi {copy}; (NaN weights saved over its "
        f"checkpoint); {seal}; {force}; {train}",
        "expected": "seal refuses the changed files naming them; --force seals them naming "
        "them; the NaN surrogate is refused at load in one line, nothing trained",
        "got": f"seal {said(refused, 'error')}; seal --force {said(forced, 'sealed')}; "
        f"train {said(trained, 'error')}",
        "held": held,
    }


def search_measures_nothing_known(out: Path) -> dict:
    """6: `optimize --search evolutionary` after the heuristic and the agent."""
    report = out / "o"
    done, command = cli(
        "optimize", str(kernel(out)), "--out", str(report), "--budget", "1",
        "--search", "evolutionary", "--search-budget", "2",
    )  # fmt: skip
    rows = []
    if (report / "measurements.jsonl").is_file():
        lines = (report / "measurements.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
    hashes = [r["schedule_hash"] for r in rows]
    sources = [r["source"] for r in rows]
    held = done.returncode == 0 and len(rows) == 5 and len(set(hashes)) == len(hashes)
    return {
        "command": command,
        "expected": "the heuristic's and the agent's schedules are never measured again; the "
        "search's two measurements are new schedules, credited to it",
        "got": f"{said(done, 'best:')}; measured {', '.join(sources)}; "
        f"{len(set(hashes))} distinct schedules of {len(hashes)}",
        "held": held,
    }


CASES = [
    (2, "validate resumes by program hash, not by name", changed_program_refused),
    (5, "integrity seal and load refuse a NaN-damaged surrogate", damaged_surrogate_refused),
    (
        6,
        "the evolutionary search never re-measures a known schedule",
        search_measures_nothing_known,
    ),
    (11, "validate's replay commands for user files run as printed", replay_commands_run),
]
