"""The rows `optimize-model` writes: one per layer and thread count, and the model's summary;
with the JSONL file helpers that make a run resumable."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mlirrl_jax.records import Record

METHODS = ("unscheduled", "heuristic", "agent", "tuned", "xla")


@dataclass
class LayerRow(Record):
    """One distinct layer at one thread count: each method's verified median time (ms)."""

    layer: str
    threads: int
    count: int
    flops: int | None
    unscheduled_ms: float | None = None
    heuristic_ms: float | None = None
    agent_ms: float | None = None  # the best verified of the agent's proposals
    agent_source: str | None = None
    xla_ms: float | None = None  # None: no exact JAX translation, or it failed
    failures: list[str] = field(default_factory=list)  # "source: status" of failed candidates
    measured: int = 0
    # the evolutionary search on the layers that take most of the model's time (--search-top)
    searched: bool = False
    search_ms: float | None = None  # its best verified schedule
    tuned_ms: float | None = None  # the better of the agent's and the search's (the agent's
    tuned_source: str | None = None  # where the layer was not searched)

    def __post_init__(self) -> None:
        if self.tuned_ms is None:
            self.tuned_ms, self.tuned_source = self.agent_ms, self.agent_source


def latest(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """The last row of each (layer, threads): a searched layer's row follows its first one."""
    return {(row["layer"], row["threads"]): row for row in rows}


@dataclass
class ModelSummary(Record):
    """The model's composed times per thread count and method, with PyTorch's."""

    model: str
    machine_id: str
    budget: int
    threads: list[int]
    composed_ms: dict[str, dict[str, float]]  # threads -> method -> ms
    torch_ms: dict[str, dict[str, float]]  # threads -> eager / compile -> ms
    missing: dict[str, dict[str, int]]  # threads -> method -> layers it has no time for
    replay_error: dict[str, float]  # threads -> the best schedules' replay vs the model
    leaves_out: list[str]
    layers: int
    occurrences: int
    replay_note: str | None = None  # why the replay could not run (then no replay_error)
    warning: str | None = None  # an import whose check failed, optimized with --force


def read_rows(path: Path) -> list[dict]:
    """The whole rows of a JSONL file; a last line a kill cut short is dropped from the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        os.truncate(path, whole)
    return [json.loads(line) for line in data[:whole].decode().splitlines() if line.strip()]


def append_row(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
