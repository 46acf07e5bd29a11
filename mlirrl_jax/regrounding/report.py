"""The rounds' report: one line per round in the log, the markdown table and the plots."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from mlirrl_jax.records import RoundRow
from mlirrl_jax.runfolder import write_atomic
from mlirrl_jax.schedule import Schedule
from mlirrl_jax.util.plots import pyplot, save_figure
from mlirrl_jax.util.stats import geomean

log = logging.getLogger(__name__)


def budget_line(round_: int, budget: dict, left: int) -> str:
    """What a round's plan asks for, within its allowance, and what was cut."""
    cut = ", ".join(f"{n} {role}" for role, n in budget["cut"].items())
    return (
        f"round {round_}: {budget['planned']} new measurements planned"
        f" (the plan wanted {budget['wanted']}; {budget['allowance']} allowed of {left} left)"
        + (f"; cut: {cut}" if cut else "")
    )


def round_line(row: RoundRow) -> str:
    def m(key: str, name: str) -> str:
        value = (getattr(row, key) or {}).get(name)
        return (
            "-"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else f"{value:.3f}"
        )

    return (
        f"round {row.round}: on-policy MAPE {m('on_policy_before', 'mape_speedup')} before, "
        f"held-back {m('held_back_before', 'mape_speedup')} -> {m('held_back_after', 'mape_speedup')}"
        f"{' (update refused: previous weights kept)' if row.update_refused else ''}; "
        f"validation Spearman {m('validation', 'spearman')} (prior {m('validation_prior', 'spearman')}); "
        f"real greedy on tracked programs {row.real_track_geomean or float('nan'):.2f}x; "
        f"{row.spent} measurements spent"
    )


def format_rounds(rows: list[RoundRow]) -> str:
    """Markdown: per round, the surrogate's on-policy error before its update, on the
    held-back programs after it, on this machine's validation programs, and the real
    geomean speedups of the agent's greedy schedules."""

    def m(row: RoundRow, key: str, name: str, fmt: str = ".3f") -> str:
        value = (getattr(row, key) or {}).get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return format(value, fmt)

    def x(row: RoundRow, key: str) -> str:
        value = getattr(row, key)
        return f"{value:.2f}x" if value is not None else "-"

    def three(row: RoundRow, key: str, name: str, fmt: str) -> str:
        """The surrogate's (`key`), the prior's and the scratch trees' score `name`."""
        base = key.removesuffix("_before").removesuffix("_after")
        keys = (key, base + "_prior", base + "_scratch")
        return " / ".join(m(row, k, name, fmt) for k in keys)

    lines = [
        "Each error cell: the re-grounded surrogate / the prior not fine-tuned / trees fitted "
        "from scratch on this machine's rows alone, on the same rows.",
        "",
        "| round | measured (total) | on-policy MAPE before update | on-policy Spearman | "
        "top-1 hit | held-back MAPE after update | validation Spearman | validation MAPE "
        "| real greedy, tracked | real greedy, held-out / heuristic |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.round} | {r.measured_now} ({r.spent}) | "
            f"{three(r, 'on_policy_before', 'mape_speedup', '.1%')} | "
            f"{three(r, 'on_policy_before', 'spearman', '.3f')} | "
            f"{three(r, 'on_policy_before', 'top1_hit', '.2f')} | "
            f"{three(r, 'held_back_after', 'mape_speedup', '.1%')} | "
            f"{three(r, 'validation', 'spearman', '.3f')} | "
            f"{three(r, 'validation', 'mape_speedup', '.1%')} | {x(r, 'real_track_geomean')} | "
            f"{x(r, 'real_heldout_geomean')} / {x(r, 'real_heuristic_geomean')} |"
        )
    return "\n".join(lines)


def save_round_plots(directory: Path, rows: list[RoundRow], points: list[dict]) -> list[Path]:
    """`onpolicy_error.png` (the errors per round) and `predicted_vs_real.png` (each round's
    measured schedules: the speedup the surrogate predicted when choosing them against the
    real one, coloured by round)."""
    plt = pyplot()
    written = []
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        rounds_ = [r.round for r in rows]
        for key, label in (
            ("on_policy_before", "on-policy, before the update"),
            ("held_back_after", "held-back programs, after the update"),
            ("validation", "validation programs (this machine)"),
        ):
            values = [(getattr(r, key) or {}).get("mape_speedup", math.nan) for r in rows]
            ax.plot(rounds_, values, marker="o", label=label)
        ax.axhline(0.2, color="grey", linestyle=":", label="20%")
        ax.set_xlabel("round")
        ax.set_ylabel("MAPE of speedup")
        ax.legend()
        fig.tight_layout()
        written.append(save_figure(fig, directory / "onpolicy_error.png"))
    if points:
        fig, ax = plt.subplots(figsize=(5, 5))
        scatter = ax.scatter(
            [p["real"] for p in points],
            [p["predicted"] for p in points],
            c=[p["round"] for p in points],
            cmap="viridis",
            s=12,
        )
        low = min(min(p["real"], p["predicted"]) for p in points)
        high = max(max(p["real"], p["predicted"]) for p in points)
        ax.plot([low, high], [low, high], color="grey", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("real speedup (this machine)")
        ax.set_ylabel("predicted when chosen")
        fig.colorbar(scatter, label="round")
        fig.tight_layout()
        written.append(save_figure(fig, directory / "predicted_vs_real.png"))
    return written


def real_speedups(planned: list, folder: Path, time_of) -> dict:
    """Real geomean speedups over unscheduled of a round's tracked and held-out schedules
    (`time_of(program, schedule)`: the verified time, or None); the learned schedules'
    predicted and real speedups go to `folder/points.json`."""
    out = {}
    points = []
    for p in planned:
        if p.role != "learn" or not p.predicted_speedup:
            continue
        base, tuned = time_of(p.program, Schedule()), time_of(p.program, p.schedule)
        if base and tuned:
            points.append({"predicted": p.predicted_speedup, "real": base / tuned})
    write_atomic(folder / "points.json", json.dumps(points))
    for role in ("track", "heldout", "heuristic"):
        speedups = []
        for p in planned:
            if p.role != role:
                continue
            base, tuned = time_of(p.program, Schedule()), time_of(p.program, p.schedule)
            if base and tuned:
                speedups.append(base / tuned)
        if speedups:
            out[f"real_{role}_geomean"] = geomean(speedups)
            out[f"real_{role}_programs"] = len(speedups)
    if "real_heldout_geomean" in out and "real_heuristic_geomean" in out:
        out["heldout_over_heuristic"] = out["real_heldout_geomean"] / out["real_heuristic_geomean"]
    return out
