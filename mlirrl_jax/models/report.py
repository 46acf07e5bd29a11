"""A model's optimization as composed times, a per-layer table and a plot of where time goes."""

from __future__ import annotations

import json
from pathlib import Path

from mlirrl_jax.models.importer import ModelImport
from mlirrl_jax.models.rows import METHODS, LayerRow, ModelSummary, latest, read_rows
from mlirrl_jax.runfolder import write_atomic

LEAVES_OUT = [
    "layout changes between layers",
    "fusion across layers (XLA and torch.compile may fuse across them; the layers here are "
    "timed one by one, each with warm caches as any kernel timed alone)",
]


def _rows_by_threads(out: Path) -> dict[int, list[dict]]:
    by: dict[int, list[dict]] = {}
    for row in latest(read_rows(out / "layers.jsonl")).values():
        row = LayerRow.from_json(row).to_json()  # rows of older runs gain the tuned time
        by.setdefault(row["threads"], []).append(row)
    return by


def compose(rows: list[dict]) -> tuple[dict[str, float], dict[str, int]]:
    """Each method's model time (ms, counts weighted) and the layers it has no time for: those
    are counted at the agent's time, so that the sums cover the same layers, and a layer no
    schedule of the agent's verified on (nor unscheduled) is left out of every sum alike."""
    totals, missing = {}, {}
    for method in METHODS:
        total, lacking = 0.0, 0
        for row in rows:
            ms = row.get(f"{method}_ms")
            if ms is None:
                lacking += 1
                ms = row.get("agent_ms") or 0.0
            total += row["count"] * ms
        totals[method], missing[method] = total, lacking
    return totals, missing


def leaves_out(imported: ModelImport) -> list[str]:
    """What a composed time leaves out: the import's ops that are in no layer, by name, first."""
    ops = ", ".join(f"{name} x{count}" for name, count in sorted(imported.left_out.items()))
    return ([f"the ops in no layer ({ops}; see the import's report)"] if ops else []) + LEAVES_OUT


def write_report(
    out: Path,
    imported: ModelImport,
    settings: dict,
    threads,
    replay: dict,
    replay_note: str | None = None,
    warning: str | None = None,
) -> ModelSummary:
    """Write `table.md`, `time_by_layer.png` and, last, `summary.json`; the summary.
    `replay_note`: why the best schedules could not be replayed; `warning`: said first."""
    by = _rows_by_threads(out)
    torch = {str(r["threads"]): r for r in read_rows(out / "torch.jsonl")}
    composed, missing, torch_ms = {}, {}, {}
    for t in threads:
        composed[str(t)], missing[str(t)] = compose(by.get(t, []))
        row = torch.get(str(t), {})
        torch_ms[str(t)] = {k: row[f"{k}_ms"] for k in ("eager", "compile") if f"{k}_ms" in row}
    summary = ModelSummary(
        model=imported.source,
        machine_id=settings["machine_id"],
        budget=settings["budget"],
        threads=list(threads),
        composed_ms=composed,
        torch_ms=torch_ms,
        missing=missing,
        replay_error=replay,
        leaves_out=leaves_out(imported),
        layers=len(imported.layers),
        occurrences=imported.occurrences,
        replay_note=replay_note,
        warning=warning,
    )
    kept = {layer.name: layer.reason for layer in imported.layers if layer.status == "unscheduled"}
    write_atomic(out / "table.md", table(summary, by, torch, kept))
    plot(out / "time_by_layer.png", by, imported.source)
    write_atomic(out / "summary.json", json.dumps(summary.to_json(), indent=1))  # last
    return summary


def table(summary, by: dict[int, list[dict]], torch: dict, kept: dict[str, str]) -> str:
    """The report as Markdown; `kept`: the layers beyond the agent, with why."""
    searched = any(r["searched"] for rows in by.values() for r in rows)
    best = "tuned" if searched else "agent"
    lines = [
        f"# {summary.model} on machine {summary.machine_id} (agent budget {summary.budget})",
        "",
        *([f"**{summary.warning}**", ""] if summary.warning else []),
        "## The whole model (ms; layers composed by their counts)",
        "",
        "| threads | unscheduled | heuristic | agent | "
        + ("agent + search | " if searched else "")
        + "XLA:CPU (layers) | PyTorch eager | torch.compile | eager / ours | "
        "best schedules' output vs the model |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if searched else ""),
    ]
    for t in summary.threads:
        c, p = summary.composed_ms[str(t)], summary.torch_ms.get(str(t), {})
        eager = p.get("eager")
        ratio = f"{eager / c[best]:.2f}x" if eager and c[best] else "-"
        failed = torch.get(str(t), {}).get("compile_failed")
        compiled = (
            f"{p['compile']:.2f}" if "compile" in p else f"failed: {failed}" if failed else "-"
        )
        replayed = summary.replay_error.get(str(t))
        lines.append(
            f"| {t} | {c['unscheduled']:.2f} | {c['heuristic']:.2f} | {c['agent']:.2f} | "
            + (f"{c['tuned']:.2f} | " if searched else "")
            + f"{c['xla']:.2f} | {f'{eager:.2f}' if eager else '-'} | {compiled} | {ratio} | "
            + ("could not run |" if replayed is None else f"{replayed:.1e} |")
        )
    if summary.replay_note:
        lines.append(
            "\nThe best schedules could not be replayed through the model, so their output is "
            f"not checked against the model's: {summary.replay_note}"
        )
    for t in summary.threads:
        m = {k: v for k, v in summary.missing[str(t)].items() if v}
        if m:
            lines.append(
                f"\nAt {t} thread(s), layers with no verified time of a method, counted at the "
                "agent's (or, with none of the agent's either, left out of every sum alike): "
                + ", ".join(f"{k} {v}" for k, v in m.items())
            )
    lines += ["", "A composed time leaves out: " + "; ".join(summary.leaves_out) + ".", ""]
    for t in summary.threads:
        rows = sorted(by.get(t, []), key=lambda r: -(r["count"] * (r["tuned_ms"] or 0)))
        total = sum(r["count"] * (r["tuned_ms"] or 0) for r in rows) or 1.0
        lines += [
            f"## Layers at {t} thread(s), by their share of the model's time",
            "",
            "| layer | count | MFLOP | unscheduled | heuristic | agent | search | XLA | "
            "ours / heuristic | ours / XLA | share | best |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            # a layer beyond the agent has no heuristic's or agent's time: it runs unscheduled
            scheduled = {k: None if r["layer"] in kept else r[k] for k in SCHEDULED}
            lines.append(
                f"| {r['layer']} | {r['count']} | {(r['flops'] or 0) / 1e6:.1f} | "
                f"{_f(r['unscheduled_ms'])} | {_f(scheduled['heuristic_ms'])} | "
                f"{_f(scheduled['agent_ms'])} | {_f(scheduled['search_ms'])} | {_f(r['xla_ms'])} | "
                f"{_ratio(scheduled['heuristic_ms'], r['tuned_ms'])} | "
                f"{_ratio(r['xla_ms'], r['tuned_ms'])} | "
                f"{100 * r['count'] * (r['tuned_ms'] or 0) / total:.1f}% | {r['tuned_source']} |"
            )
        beyond = [r["layer"] for r in rows if r["layer"] in kept]
        if beyond:
            lines += ["", "Layers run unscheduled in every method's sum (no schedule is tried):"]
        lines += [f"- {name}: {kept[name]}" for name in beyond]
        failed = [r for r in rows if r["failures"]]
        if failed:
            lines += ["", "Candidates that failed (a result, not the end of the run):"]
        for r in failed:
            more = f" and {len(r['failures']) - 3} more" if len(r["failures"]) > 3 else ""
            lines.append(f"- {r['layer']}: {'; '.join(r['failures'][:3])}{more}")
        lines.append("")
    return "\n".join(lines)


SCHEDULED = ("heuristic_ms", "agent_ms", "search_ms")


def _f(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def plot(path: Path, by: dict[int, list[dict]], title: str) -> None:
    """Per layer (the 15 that take most of the agent's time), count x time by each method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted(by)
    fig, axes = plt.subplots(1, len(threads), figsize=(7 * len(threads), 6), squeeze=False)
    for ax, t in zip(axes[0], threads, strict=True):
        rows = sorted(by[t], key=lambda r: -(r["count"] * (r["tuned_ms"] or 0)))[:15][::-1]
        names = [f"{r['layer'][:28]} x{r['count']}" for r in rows]
        for k, (method, colour) in enumerate(
            [("heuristic", "tab:gray"), ("tuned", "tab:blue"), ("xla", "tab:orange")]
        ):
            values = [r["count"] * (r[f"{method}_ms"] or 0) for r in rows]
            ax.barh(
                [i + 0.27 * (k - 1) for i in range(len(rows))],
                values,
                0.27,
                label={"tuned": "ours (agent; + search where run)"}.get(method, method),
                color=colour,
            )
        ax.set_yticks(range(len(rows)), names, fontsize=7)
        ax.set_xlabel("ms in the model (count x layer time)")
        ax.set_title(f"{t} thread(s)")
        ax.legend()
    fig.suptitle(f"Where the time goes: {title}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
