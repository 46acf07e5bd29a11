"""Tables and plots of measurement results."""

from __future__ import annotations

from pathlib import Path

_COLUMNS = (
    ("program", "program", "{}"),
    ("baseline_ms", "baseline ms", "{:.3f}"),
    ("scheduled_ms", "scheduled ms", "{:.3f}"),
    ("speedup", "speedup", "{:.1f}x"),
    ("gflops", "GFLOP/s", "{:.1f}"),
    ("verified", "verified", "{}"),
    ("measure_s", "measure s", "{:.2f}"),
    ("status", "status", "{}"),
)


def format_table(rows: list[dict], columns=_COLUMNS) -> str:
    """A Markdown table; missing values show as '-'."""
    header = [title for _, title, _ in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = []
        for key, _, fmt in columns:
            value = row.get(key)
            cells.append("-" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_speedup_plot(rows: list[dict], path: Path) -> Path | None:
    """A bar chart of speedups (log scale); None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [r["program"].split("/")[-1] for r in rows]
    values = [r["speedup"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    ax.barh(names, values, color=["tab:green" if r["verified"] else "tab:red" for r in rows])
    ax.set_xscale("log")
    ax.set_xlabel("speedup over the unscheduled kernel (log scale; red: not verified)")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.1f}x", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
