"""The validation's report beside its rows: the methods' names, each method's speedups, the
sample efficiency of the searches against the agent, and the plots.

Sample efficiency: a search's trials are kept in the order it measured them (`trials_ms` of
its entry in a row), so the best of its first n trials is what it would have found with a
budget of n. Per program, the budget it needs to equal the agent's top-k (the smallest n whose
best is at most the agent's time) is its cost of matching the agent; the curve is the geomean
over programs of the best-of-n speedup over unscheduled, against n, with the agent's top-k
level beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlirrl_jax.records import ValidationRow
from mlirrl_jax.strategies import Method, registry
from mlirrl_jax.util.plots import pyplot, save_figure
from mlirrl_jax.util.stats import geomean

SCHEDULED = tuple(m.value for m in Method)  # every strategy's, in the reports' order
EXTERNAL = ("xla", "numpy")
METHODS = ("unscheduled", *SCHEDULED, *EXTERNAL)
LABELS = {
    "unscheduled": "unscheduled",
    **{m.value: strategy.label for m, strategy in registry().items()},
    "xla": "XLA:CPU",
    "numpy": "NumPy/BLAS",
}


def speedups(row: ValidationRow) -> dict[str, float | None]:
    """Each method's speedup over the unscheduled program in one row."""
    base = row.methods["unscheduled"].ms
    return {name: (base / m.ms if base and m.ms else None) for name, m in row.methods.items()}


# what a user could have had otherwise
SEARCHES = tuple(m.value for m, strategy in registry().items() if strategy.baseline)
BASELINES = (*SEARCHES, *EXTERNAL)
# the searches whose trials a row keeps in order, for the sample-efficiency curve
TRIAL_METHODS = tuple(m.value for m, strategy in registry().items() if strategy.curve)


def running_best(trials_ms: list) -> list:
    """The best verified time of the first n trials, for each n (None until one verified)."""
    best, out = None, []
    for ms in trials_ms:
        if ms is not None and (best is None or ms < best):
            best = ms
        out.append(best)
    return out


def budget_to_match(trials_ms: list, target_ms: float) -> int | None:
    """The smallest number of trials whose best is at most `target_ms` (None: never)."""
    for n, best in enumerate(running_best(trials_ms), 1):
        if best is not None and best <= target_ms:
            return n
    return None


def sample_efficiency(rows: list[ValidationRow], threads) -> dict:
    """Per thread count and search (`TRIAL_METHODS`, where the rows have its trials): the
    budget it needed on each program to equal the agent's top-k, how many programs it
    matched within its budget, the median budget (programs never matched count as beyond
    it), and the curve of its geomean best-of-n speedup with the agent's level."""
    out: dict = {}
    for t in threads:
        group = [r for r in rows if r.threads == t]
        entry: dict = {}
        for name in TRIAL_METHODS:
            have = [
                r
                for r in group
                if name in r.methods
                and r.methods[name].trials_ms
                and r.methods["agent_topk"].ms
                and r.methods["unscheduled"].ms
            ]
            if not have:
                continue
            budget = min(len(r.methods[name].trials_ms) for r in have)
            needed = [
                budget_to_match(r.methods[name].trials_ms, r.methods["agent_topk"].ms) for r in have
            ]
            ranked = sorted(n if n is not None else budget + 1 for n in needed)
            curve = []
            for n in range(1, budget + 1):
                best = [
                    r.methods["unscheduled"].ms / b
                    for r in have
                    if (b := running_best(r.methods[name].trials_ms)[n - 1])
                ]
                curve.append(geomean(best) if len(best) == len(have) else None)
            entry[name] = {
                "programs": len(have),
                "budget": budget,
                "matched": sum(n is not None for n in needed),
                "median_budget_to_match": ranked[len(ranked) // 2],
                "budget_to_match": {r.program: n for r, n in zip(have, needed, strict=True)},
                "curve": curve,
                "agent_topk": geomean(
                    [r.methods["unscheduled"].ms / r.methods["agent_topk"].ms for r in have]
                ),
            }
        if entry:
            out[str(t)] = entry
    return out


def format_sample_efficiency(efficiency: dict, k: int) -> list[str]:
    """Markdown lines: per thread count and search, how much budget it needed to equal the
    agent's top-k (k real measurements)."""
    if not efficiency:
        return []
    lines = [
        "",
        "## Sample efficiency: the budget a search needs to equal the agent's top-k",
        "",
        f"Per program, the smallest number of the search's own measurements whose best is at "
        f"least as fast as the agent's top-{k} ({k} measurements); a median beyond the budget "
        "means that most programs were not matched within it. Curve: "
        "`validation_sample_efficiency.png`.",
        "",
        "| threads | search | programs | budget | matched within it | median budget to match | "
        "geomean best-of-budget / agent top-k |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, entry in efficiency.items():
        for name, e in entry.items():
            median = e["median_budget_to_match"]
            shown = f"> {e['budget']}" if median > e["budget"] else str(median)
            last = e["curve"][-1] if e["curve"] else None
            ratio = f"{last / e['agent_topk']:.3f}" if last and e["agent_topk"] else "-"
            lines.append(
                f"| {t} | {LABELS[name]} | {e['programs']} | {e['budget']} | {e['matched']} | "
                f"{shown} | {ratio} |"
            )
    return lines


def save_sample_efficiency_plot(efficiency: dict, folder: Path) -> Path | None:
    """Each search's geomean best-of-n speedup against n, with the agent's top-k level."""
    if not efficiency:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(efficiency), figsize=(6 * len(efficiency), 4.5), squeeze=False)
    for ax, (t, entry) in zip(axes[0], efficiency.items(), strict=True):
        for name, e in entry.items():
            xs = [n for n, v in enumerate(e["curve"], 1) if v]
            ax.plot(xs, [e["curve"][n - 1] for n in xs], label=LABELS[name])
            ax.axhline(e["agent_topk"], color="tab:green", ls="--", lw=1)
        ax.text(1, next(iter(entry.values()))["agent_topk"], " agent top-k", va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("real measurements of the search")
        ax.set_ylabel("geomean speedup over unscheduled (best so far)")
        ax.set_title(f"{t} thread(s)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, folder / "validation_sample_efficiency.png")


def save_validation_plots(rows: list[ValidationRow], folder: Path) -> list[Path]:
    """Speedup per program per method, the CDF of the agent's speedup over the best baseline,
    and predicted against real speedup of the agent's and the guided search's schedules."""
    plt = pyplot()

    written = []
    thread_counts = sorted({r.threads for r in rows})
    if not rows:
        return written
    fig, axes = plt.subplots(
        1, len(thread_counts), figsize=(7 * len(thread_counts), 4.5), squeeze=False
    )
    for ax, threads in zip(axes[0], thread_counts, strict=True):
        group = [r for r in rows if r.threads == threads]
        per = [speedups(r) for r in group]
        order = np.argsort([s.get("heuristic") or 0 for s in per])
        for name, marker in (
            ("heuristic", "s"),
            ("random_8k", "^"),
            ("evolutionary", "v"),
            ("xla", "x"),
            ("agent_greedy", "."),
            ("agent_topk", "o"),
        ):
            ys = [per[i].get(name) for i in order]
            xs = [j for j, y in enumerate(ys) if y]
            ax.plot(xs, [ys[j] for j in xs], marker, label=LABELS[name], alpha=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{threads} thread(s)")
        ax.set_xlabel("program (sorted by the heuristic's speedup)")
        ax.set_ylabel("real speedup over unscheduled")
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, folder / "validation_speedups.png"))

    # each plot below draws its own figure: the matplotlib calls alike, the data each its own
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for threads in thread_counts:
        for name in ("agent_topk", "agent_greedy"):
            ratios = []
            for r in rows:
                if r.threads != threads:
                    continue
                s = speedups(r)
                best = max((s[b] for b in BASELINES if s.get(b)), default=None)
                if s.get(name) and best:
                    ratios.append(s[name] / best)
            if ratios:
                ratios.sort()
                ax.step(
                    ratios,
                    np.arange(1, len(ratios) + 1) / len(ratios),
                    where="post",
                    label=f"{LABELS[name]}, {threads} thread(s)",
                )
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("speedup over the best baseline (heuristic, searches, XLA, NumPy)")
    ax.set_ylabel("fraction of programs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, folder / "validation_cdf.png"))

    fig, ax = plt.subplots(figsize=(5, 5))
    points = []
    for r in rows:
        s = speedups(r)
        for name, marker in (("agent_topk", "o"), ("surrogate_topk", "^"), ("heuristic", "s")):
            predicted = r.methods[name].predicted if name in r.methods else None
            if predicted and s.get(name):
                points.append((s[name], predicted, name, marker))
    for name, marker in (("agent_topk", "o"), ("surrogate_topk", "^"), ("heuristic", "s")):
        mine = [p for p in points if p[2] == name]
        if mine:
            ax.scatter(
                [p[0] for p in mine], [p[1] for p in mine], s=14, marker=marker, label=LABELS[name]
            )
    if points:
        lo = min(min(p[0], p[1]) for p in points)
        hi = max(max(p[0], p[1]) for p in points)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("real speedup")
    ax.set_ylabel("surrogate's predicted speedup (one thread)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(save_figure(fig, folder / "validation_predicted.png"))
    efficiency = sample_efficiency(rows, sorted({r.threads for r in rows}))
    plotted = save_sample_efficiency_plot(efficiency, folder)
    if plotted:
        written.append(plotted)
    return written
