"""The commands' promises, shown on the real CLI: imports count once, damage is named, one
process per run folder, and a re-grounding run's real budget is a cap.

    python bench/promises.py --out runs/promises [--skip-regrounding]

1. `store import` of the shipped seed Parquet three times into a fresh store: the statistics of
   every row (n_measured, samples, median, ...) after the third import equal those after the
   first, byte for byte.
2. Every file of copies of `data/agent` and `data/cost_model`, each damaged in three ways
   (bytes flipped, cut short, deleted) in turn: `mlirrl-jax show ... --agent COPY` (the agent's
   files) or `mlirrl-jax train --surrogate COPY` (the surrogate's) ends with exit status 2 and
   one stderr line naming the file.
3. A short training run, then `train --out R --resume` twice at once: the second is refused
   (exit 2) and how long it took is recorded, from its start to its end.
4. `train --rounds 2 --iterations-per-round 10 --real-budget 60` into a fresh store: this
   machine's rows in the store, the lines of `measured.jsonl` and the iterations trained.

Writes `promises.json` and `promises.md` to --out; every figure comes with the command that
produced it and this machine's id.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mlirrl_jax.cli import main as cli
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.runfolder import LOCK
from mlirrl_jax.shipped import SHIPPED_AGENT, SHIPPED_SEEDS, SHIPPED_SURROGATE

MLIRRL = [sys.executable, "-m", "mlirrl_jax.cli"]
PROGRAM = "suite://dl-v0/matmul_m32_n1000_k512"
STATISTICS = (
    "program_hash, schedule_hash, machine_id, threads, status, verified, median_s, min_s, "
    "spread, samples, n_measured, n_failed, max_error"
)


def statistics_digest(store: Path) -> tuple[str, int, int]:
    """sha256 of every row's statistics in key order, the row count and the sum of
    n_measured."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        rows = db.execute(
            f"SELECT {STATISTICS} FROM measurements "
            "ORDER BY program_hash, schedule_hash, machine_id, threads"
        ).fetchall()
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return digest, len(rows), sum(r[10] for r in rows)


def imports(out: Path) -> dict:
    """The seed imported three times into a fresh store."""
    seed = sorted(SHIPPED_SEEDS.glob("*.parquet"))[0]
    store = out / "imports.db"
    store.unlink(missing_ok=True)
    command = [*MLIRRL, "store", "import", str(seed), "--store", str(store)]
    command.append("--allow-other-machines")
    after = []
    for n in range(3):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        digest, rows, measured = statistics_digest(store)
        after.append(
            {
                "import": n + 1,
                "said": done.stdout.strip(),
                "seconds": time.perf_counter() - started,
                "rows": rows,
                "n_measured": measured,
                "statistics_sha256": digest,
            }
        )
        print(f"import {n + 1}: {rows} rows, n_measured {measured}, {digest[:12]}", flush=True)
    return {
        "command": " ".join(["mlirrl-jax", *command[3:]]) + "  (three times)",
        "after": after,
        "equal_after_first": all(
            a["statistics_sha256"] == after[0]["statistics_sha256"] for a in after
        ),
    }


def damage(path: Path, fault: str) -> None:
    """Flip 16 bytes in the middle of `path`, cut it to half its size, or delete it."""
    data = path.read_bytes()
    if fault == "delete":
        path.unlink()
    elif fault == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        noise = np.random.default_rng(len(data)).integers(1, 256, min(16, len(data)), np.uint8)
        part = (
            np.frombuffer(data[middle : middle + len(noise)], np.uint8)
            ^ noise[: len(data) - middle]
        )
        path.write_bytes(data[:middle] + part.tobytes() + data[middle + len(part) :])


def damages(out: Path) -> dict:
    """Every file of copies of the shipped agent and surrogate, damaged three ways."""
    copies = out / "shipped-copy"
    shutil.rmtree(copies, ignore_errors=True)
    agent, surrogate = copies / "agent", copies / "cost_model"
    shutil.copytree(SHIPPED_AGENT, agent)
    shutil.copytree(SHIPPED_SURROGATE, surrogate)
    rows = []
    import mlirrl_jax.integrity as integrity

    # the copies stand for the shipped folders: they must be sealed, as those must
    integrity.SHIPPED_FOLDERS = (agent.resolve(), surrogate.resolve(), SHIPPED_SEEDS)
    for folder in (surrogate, agent):  # train splits the cores into devices first
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            for fault in ("flip", "truncate", "delete"):
                original = path.read_bytes()
                damage(path, fault)
                stderr = io.StringIO()
                started = time.perf_counter()
                # the agent's files through `show --agent`; the surrogate's through the start of
                # a training run against it (refused before any iteration when damaged)
                command = (
                    ["show", PROGRAM, "--agent", str(agent)]
                    if folder == agent
                    else [
                        "train",
                        "--out",
                        str(out / "refused"),
                        "--surrogate",
                        str(surrogate),
                        "--iterations",
                        "1",
                    ]
                )
                with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                    code = cli(command)
                seconds = time.perf_counter() - started
                path.write_bytes(original)
                lines = stderr.getvalue().strip().splitlines()
                name = str(path.relative_to(copies))
                named = len(lines) == 1 and name in lines[0]
                rows.append(
                    {
                        "file": name,
                        "fault": fault,
                        "exit": code,
                        "one_line_naming_it": named,
                        "seconds": seconds,
                        "line": lines[-1] if lines else "",
                    }
                )
                if not named or code != 2:
                    print(f"NOT NAMED: {name} {fault}: exit {code}: {lines}", flush=True)
    good = sum(r["one_line_naming_it"] and r["exit"] == 2 for r in rows)
    print(f"damage: {good}/{len(rows)} cases one line naming the file, exit 2", flush=True)
    return {
        "command": f"mlirrl-jax show {PROGRAM} --agent AGENT_COPY; mlirrl-jax train --out R "
        "--surrogate SURROGATE_COPY --iterations 1",
        "cases": len(rows),
        "named": good,
        "slowest_s": max(r["seconds"] for r in rows),
        "rows": rows,
    }


TINY = {"envs": 16, "steps": 8, "epochs": 1, "minibatches": 2, "surrogate": "analytic"}


def two_resumes(out: Path) -> dict:
    """A second `train --resume` of a run that another one is resuming."""
    run = out / "resume-run"
    shutil.rmtree(run, ignore_errors=True)
    config = out / "tiny.json"
    config.write_text(json.dumps(TINY))
    first = [*MLIRRL, "train", "--out", str(run), "--config", str(config), "--iterations", "2"]
    subprocess.run(first, capture_output=True, check=True)
    resume = [*MLIRRL, "train", "--out", str(run), "--resume", "--iterations", "100000"]
    owner = subprocess.Popen(resume, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (run / LOCK).is_file() or not (run / LOCK).read_text():
            time.sleep(0.05)
        started = time.perf_counter()
        second = subprocess.run(resume, capture_output=True, text=True)
        seconds = time.perf_counter() - started
    finally:
        owner.terminate()
        owner.wait()
    line = second.stderr.strip().splitlines()[-1]
    print(f"second resume: exit {second.returncode} after {seconds:.2f} s: {line}", flush=True)
    return {
        "command": " ".join(["mlirrl-jax", *resume[3:]]) + "  (twice at once)",
        "exit": second.returncode,
        "seconds_from_start_to_exit": seconds,
        "line": line,
        "owner_pid": owner.pid,
    }


def budget(out: Path) -> dict:
    """A re-grounding run with a real budget of 60 into a fresh store."""
    run, store = out / "budget60", out / "budget60.db"
    shutil.rmtree(run, ignore_errors=True)
    store.unlink(missing_ok=True)
    command = [
        *MLIRRL,
        "train",
        "--out",
        str(run),
        "--rounds",
        "2",
        "--iterations-per-round",
        "10",
        "--real-budget",
        "60",
        "--store",
        str(store),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    machine = machine_fingerprint()["machine_id"]
    with contextlib.closing(sqlite3.connect(store)) as db:
        (rows,) = db.execute(
            "SELECT COUNT(*) FROM measurements WHERE machine_id = ?", (machine,)
        ).fetchone()
    spent = len((run / "regrounding" / "measured.jsonl").read_text().splitlines())
    rounds = [
        json.loads(line) for line in (run / "regrounding" / "rounds.jsonl").read_text().splitlines()
    ]
    summary = json.loads((run / "summary.json").read_text())
    result = {
        "command": " ".join(["mlirrl-jax", *command[3:]]),
        "store_rows": rows,
        "measured_jsonl_lines": spent,
        "iterations": summary["iterations"],
        "wall_s": time.perf_counter() - started,
        "rounds": [{k: r.get(k) for k in ("round", "wanted", "planned", "cut")} for r in rounds],
    }
    print(f"budget 60: {rows} rows stored, {spent} spent, {summary['iterations']} iterations")
    return result


def report(results: dict) -> str:
    lines = [f"Machine {results['machine_id']}, {results['date']}.", ""]
    if "imports" in results:
        i = results["imports"]
        lines += [
            f"Imports (`{i['command']}`):",
            "",
            "| import | rows | sum of n_measured | statistics sha256 | said |",
            "|---|---|---|---|---|",
            *(
                f"| {a['import']} | {a['rows']} | {a['n_measured']} | "
                f"{a['statistics_sha256'][:16]} | {a['said']} |"
                for a in i["after"]
            ),
            "",
            f"Equal after the first: {i['equal_after_first']}.",
            "",
        ]
    if "damage" in results:
        d = results["damage"]
        lines += [
            f"Damage (`{d['command']}`): {d['named']} of {d['cases']} cases (every file of "
            "data/agent and data/cost_model, flipped, cut short, deleted) ended with exit 2 and "
            f"one line naming the file; slowest {d['slowest_s']:.2f} s.",
            "",
        ]
    if "resume" in results:
        r = results["resume"]
        lines += [
            f"Two resumes (`{r['command']}`): the second exited {r['exit']} after "
            f"{r['seconds_from_start_to_exit']:.2f} s (its whole process): `{r['line']}`",
            "",
        ]
    if "budget" in results:
        b = results["budget"]
        lines += [
            f"Real budget (`{b['command']}`): {b['store_rows']} rows of this machine in the "
            f"store, {b['measured_jsonl_lines']} lines in measured.jsonl, {b['iterations']} "
            f"iterations, {b['wall_s']:.0f} s. Rounds: {json.dumps(b['rounds'])}",
            "",
        ]
    return "\n".join(lines)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/promises")
    parser.add_argument("--skip-regrounding", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "machine_id": machine_fingerprint()["machine_id"],
        "date": time.strftime("%Y-%m-%d"),
    }
    results["imports"] = imports(out)
    results["damage"] = damages(out)
    results["resume"] = two_resumes(out)
    if not args.skip_regrounding:
        results["budget"] = budget(out)
    (out / "promises.json").write_text(json.dumps(results, indent=1))
    (out / "promises.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(run())
