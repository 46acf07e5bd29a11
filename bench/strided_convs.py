"""Strided convolutions of imported models: direct, or as a gather and a contraction.

For every strided convolution layer of the given imports (`import-model`, whose folders keep
the direct form beside each gathered layer: `Layer.direct_path`; an import cut with
`--strided-conv direct` has none), at each thread count, in one run and one worker, every
output verified: the direct form under the heuristic (version 6), the gathered form under
the heuristic (version 6, and version 5 for the rows it changes), and XLA:CPU's `jax.jit` of
the direct form. Each is measured `--repeats` times, interleaved; prints the median times and
the gathered form's speedup over the direct one, writes `strided_convs.json` and a Markdown
table under `--out`.

    python bench/strided_convs.py runs/models/resnet18 [runs/models/mobilenet_v2 ...]
        [--threads 1,2] [--repeats 5] [--out bench/results/strided-convs-ID]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from mlirrl_jax.heuristics import heuristic_schedule
from mlirrl_jax.measure.baselines import measure_xla
from mlirrl_jax.measure.fingerprint import machine_fingerprint
from mlirrl_jax.measure.runner import Runner
from mlirrl_jax.measure.timing import TimingMethod
from mlirrl_jax.models.importer import ModelImport
from mlirrl_jax.programs.ir import load_program


def _ms(m) -> float | None:
    return m.median_s * 1e3 if m is not None and m.ok and m.verified and m.median_s else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("imports", nargs="+", help="folders written by import-model")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    machine = machine_fingerprint()["machine_id"]
    out = Path(args.out or f"bench/results/strided-convs-{machine[:4]}")
    out.mkdir(parents=True, exist_ok=True)
    layers = []
    for folder in map(Path, args.imports):
        imported = ModelImport.load(folder)
        for layer in imported.layers:
            if layer.direct_path:
                gathered = load_program(folder / layer.path, layer.name)
                direct = load_program(folder / layer.direct_path, layer.name + "_direct")
                layers.append((imported.source, layer, gathered, direct))
    print(f"{len(layers)} gathered layers, machine {machine}, threads {threads}")
    method = TimingMethod(seed=0)
    rows, started = [], time.perf_counter()
    with Runner(timeout_s=120) as runner:
        for i, (source, layer, gathered, direct) in enumerate(layers, 1):
            for t in threads:
                variants = {
                    "direct": (direct, heuristic_schedule(direct, t)),
                    "gathered": (gathered, heuristic_schedule(gathered, t)),
                    "gathered_v5": (gathered, heuristic_schedule(gathered, t, version=5)),
                }
                times: dict[str, list] = {name: [] for name in [*variants, "xla_direct"]}
                for _ in range(args.repeats):  # interleaved
                    for name, (program, schedule) in variants.items():
                        times[name].append(
                            _ms(runner.measure(program, schedule, threads=t, method=method))
                        )
                    times["xla_direct"].append(_ms(measure_xla(direct, t, method)))
                medians = {
                    name: statistics.median(v) if None not in v else None
                    for name, v in times.items()
                }
                row = {"model": source, "layer": layer.name, "count": layer.count, "threads": t}
                row |= {"mflop": direct.flops / 1e6, **{f"{k}_ms": v for k, v in medians.items()}}
                rows.append(row)
                gain = (
                    medians["direct"] / medians["gathered"]
                    if medians["direct"] and medians["gathered"]
                    else None
                )
                print(
                    f"[{i}/{len(layers)}] {layer.name} t={t}: direct {medians['direct']}, "
                    f"gathered {medians['gathered']} (v5 {medians['gathered_v5']}), XLA "
                    f"{medians['xla_direct']} ms; direct/gathered {gain}; "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
    (out / "strided_convs.json").write_text(
        json.dumps({"machine_id": machine, "repeats": args.repeats, "rows": rows}, indent=1)
    )
    lines = [
        f"# Strided convolutions, direct or gathered (machine {machine}, median of "
        f"{args.repeats}, ms)",
        "",
        "| model | layer | threads | MFLOP | direct (heuristic) | gathered (heuristic v6) | "
        "gathered (v5) | XLA (direct) | direct / gathered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v):
        return f"{v:.3f}" if v is not None else "failed"

    for r in rows:
        ratio = (
            f"{r['direct_ms'] / r['gathered_ms']:.2f}x"
            if r["direct_ms"] and r["gathered_ms"]
            else "-"
        )
        lines.append(
            f"| {r['model']} | {r['layer']} | {r['threads']} | {r['mflop']:.1f} | "
            f"{fmt(r['direct_ms'])} | {fmt(r['gathered_ms'])} | {fmt(r['gathered_v5_ms'])} | "
            f"{fmt(r['xla_direct_ms'])} | {ratio} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
