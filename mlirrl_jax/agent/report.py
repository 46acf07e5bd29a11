"""A training run's results as a table and a learning-curve plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlirrl_jax.util.plots import pyplot, save_figure


def format_summary(summary: dict, config) -> str:
    """Markdown: the agent's, the heuristic's and random search's geomean predicted speedups
    on the test programs, all of them and per suite."""
    random_key = config.random_best_key
    lines = [
        f"trained {summary['iterations']} iterations, {summary['env_steps']:,} environment steps "
        f"in {summary['trained_seconds']:.0f} s ({summary['steps_per_second']:,.0f} steps/s) on "
        f"machine {summary['machine_id']}; reward: {summary['surrogate'].get('kind')} of machine "
        f"{summary['surrogate'].get('machine_id', '-')}",
        "",
        "predicted geomean speedup over unscheduled, test programs (greedy agent):"
        if summary["test"]
        else "(no evaluation on the test programs: eval_every is 0)",
        "",
        f"| programs | n | agent | heuristic | best of {config.eval_random_schedules} random "
        "| agent / heuristic | agent >= random |",
        "|---|---|---|---|---|---|---|",
    ]
    if not summary["test"]:
        return "\n".join(lines[:3])
    for group, row in summary["test"].items():
        lines.append(
            f"| {group} | {row['programs']} | {row['agent']:.2f}x | {row['heuristic']:.2f}x | "
            f"{row[random_key]:.2f}x | {row['agent'] / row['heuristic']:.2f} | "
            f"{row['agent_at_least_random']:.0%} of programs |"
        )
    return "\n".join(lines)


def save_learning_curve(metrics: list[dict], path: Path, config) -> Path | None:
    """Predicted speedup against training time: the sampled episodes of each iteration (train
    programs) and the greedy agent on the test programs, with the heuristic and random search
    on the test programs as lines."""
    if not metrics:
        return None
    plt = pyplot()
    random_key = config.random_best_key
    ended = [m for m in metrics if m["mean_predicted_speedup"]]  # iterations where some did
    minutes = np.array([m["trained_seconds"] for m in ended]) / 60.0
    sampled = np.array([m["mean_predicted_speedup"] for m in ended])
    evaluated = [m for m in metrics if "test" in m]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(sampled):
        window = max(1, len(sampled) // 50)  # a moving average over 2% of the run
        smooth = np.convolve(sampled, np.ones(window) / window, mode="valid")
        ax.plot(
            minutes[window - 1 :],
            smooth,
            color="tab:blue",
            alpha=0.6,
            label="sampled episodes (train)",
        )
    if evaluated:
        at = np.array([m["trained_seconds"] for m in evaluated]) / 60.0
        ax.plot(
            at,
            [m["test"]["all"]["agent"] for m in evaluated],
            "o-",
            color="tab:green",
            label="greedy agent (test)",
        )
        last = evaluated[-1]["test"]["all"]
        ax.axhline(last["heuristic"], color="tab:red", ls="--", label="heuristic (test)")
        ax.axhline(
            last[random_key],
            color="tab:gray",
            ls=":",
            label=f"best of {config.eval_random_schedules} random (test)",
        )
    ax.set_xlabel("training time (minutes, compile excluded)")
    ax.set_ylabel("predicted geomean speedup")
    ax.set_yscale("log")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)
