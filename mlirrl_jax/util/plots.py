"""What every plot of the reports shares: pyplot without a display, and figures written whole."""

from __future__ import annotations

import io
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Write `fig` to `path` as a PNG, whole or not at all (temporary file and rename), then
    close it."""
    from mlirrl_jax.runfolder import write_atomic

    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    pyplot().close(fig)
    write_atomic(Path(path), image.getvalue())
    return Path(path)
