"""The main job's start-up: seconds from `mlirrl-jax demo` starting to its first real
measurement, for one or more checkouts of the project, in one run on this machine.

Each try starts the demo as a new user would, with an empty data directory (`MLIRRL_HOME`: no
XLA compilation cache, no reference outputs, no machine profile), in a process group of its
own, and times until the re-grounding's first measurement is on disk
(`agent/regrounding/measured.jsonl` holds a line); then the group is killed. The checkouts take
turns (before, after, before, ...), so that both see the machine in the same state.

    python bench/first_measurement.py --tree before=/tmp/before --tree after=. --repeats 2 \
        --out bench/results/first-measurement-<machine>
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlirrl_jax.measure.fingerprint import machine_fingerprint  # noqa: E402


def first_measurement(tree: Path, limit_s: float) -> float | None:
    """Seconds to the first measurement of a cold demo run from `tree` (None: none by
    `limit_s`, or the demo ended first)."""
    with tempfile.TemporaryDirectory(prefix="first-measurement-") as tmp:
        out, home = Path(tmp) / "demo", Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "PYTHONPATH": str(tree), "MLIRRL_HOME": str(home)}
        for name in ("JAX_COMPILATION_CACHE_DIR", "MLIRRL_REFERENCE_CACHE"):
            env.pop(name, None)
        measured = out / "agent" / "regrounding" / "measured.jsonl"
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "mlirrl_jax.cli", "demo", "--out", str(out)],
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            while time.perf_counter() - started < limit_s and process.poll() is None:
                if measured.is_file() and b"\n" in measured.read_bytes():
                    return time.perf_counter() - started
                time.sleep(0.1)
            return None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=checkout folder")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a try may take")
    parser.add_argument("--out", help="folder for results.json and results.md")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    seconds: dict[str, list] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name, tree in trees.items():
            took = first_measurement(Path(tree).resolve(), args.limit)
            seconds[name].append(took)
            shown = "none" if took is None else f"{took:.1f} s"
            print(f"try {r + 1}/{args.repeats}, {name}: first measurement after {shown}")
    machine = machine_fingerprint()["machine_id"]
    lines = [
        f"Start to first measurement of a cold `mlirrl-jax demo` on {machine} "
        f"({time.strftime('%Y-%m-%d')}), {args.repeats} tries each, taking turns.",
        "",
        "| checkout | tries (s) | median (s) |",
        "|---|---|---|",
    ]
    for name, tree in trees.items():
        good = [s for s in seconds[name] if s is not None]
        tries = ", ".join("-" if s is None else f"{s:.1f}" for s in seconds[name])
        median = f"{statistics.median(good):.1f}" if good else "-"
        lines.append(f"| {name} (`{tree}`) | {tries} | {median} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"machine_id": machine, "trees": trees, "seconds": seconds}
        (folder / "results.json").write_text(json.dumps(record, indent=1))
        (folder / "results.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
