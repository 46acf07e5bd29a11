"""A new user's probes of the commands, rerun: each case reproduces a reported defect's recipe
through real `mlirrl-jax` processes and says whether the command now does what it promises.

    python bench/probes.py --out runs/probes [--only 1,3,7]

The cases live beside this script, by what they probe: `probes_models.py` (import-model and
optimize-model), `probes_runs.py` (validate, the surrogate's integrity, the searches) and
`probes_cli.py` (collect, flags, this machine and its profile). Each module's `CASES` lists
`(number, title, function)`; a function takes its own scratch folder and returns the commands it
ran, what a correct tool does, what happened and whether that held.

Writes `probes.json` and `probes.md` to --out, with this machine's id and the date.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlirrl_jax.measure.fingerprint import machine_fingerprint  # noqa: E402

MODULES = ("probes_models", "probes_runs", "probes_cli")


def cases() -> list[tuple[str, str, object]]:
    """Every module's cases, by number (`9b` after `9a`, `13a` after `12`)."""
    found = []
    for name in MODULES:
        found += importlib.import_module(name).CASES
    return sorted(found, key=lambda c: (int("".join(ch for ch in str(c[0]) if ch.isdigit())), c))


def run_case(number: str, title: str, function, out: Path) -> dict:
    """One case in its own folder; a case that raises is a case that did not hold."""
    folder = out / f"case-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        result = dict(function(folder))
    except Exception as exc:  # the probe itself failed: recorded, the others go on
        result = {
            "command": "",
            "expected": "",
            "got": f"the probe raised {type(exc).__name__}: {exc}",
            "held": False,
            "traceback": traceback.format_exc(),
        }
    result |= {"number": str(number), "title": title}
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def report(results: dict) -> str:
    rows = results["cases"]
    held = sum(r["held"] for r in rows)
    lines = [
        f"Machine {results['machine_id']}, {results['date']}: {held} of {len(rows)} cases held "
        f"({results['seconds']:.0f} s in all).",
        "",
        "| # | case | command | expected | got | held | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['number']} | {_cell(r['title'])} | `{_cell(r['command'])}` | "
            f"{_cell(r['expected'])} | {_cell(r['got'])} | {'yes' if r['held'] else '**no**'} "
            f"| {r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/probes")
    parser.add_argument("--only", help="comma-separated case numbers (default: all)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    chosen = [c for c in cases() if wanted is None or str(c[0]) in wanted]
    started = time.perf_counter()
    rows = []
    for i, (number, title, function) in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] case {number}: {title}", flush=True)
        rows.append(run_case(str(number), title, function, out))
        print(f"  held: {rows[-1]['held']} ({rows[-1]['seconds']:.0f} s)", flush=True)
    results = {
        "machine_id": machine_fingerprint()["machine_id"],
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - started,
        "cases": rows,
    }
    (out / "probes.json").write_text(json.dumps(results, indent=1))
    (out / "probes.md").write_text(report(results))
    print(report(results))
    return 0 if all(r["held"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(run())
