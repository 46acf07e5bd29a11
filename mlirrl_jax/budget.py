"""A wall-clock budget shared by the phases of one job (`TimeBudget`).

Each phase gets a deadline from the budget, plans within the time left before it from rates
measured as the job goes (seconds per measurement, per round, per program), and records what
it cut and why (`TimeBudget.cut`). The cuts are part of the job's report: a user reads what a
short budget left out, never a figure that silently covers less than it says.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.runfolder import write_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cut:
    """One thing a phase left out for time."""

    phase: str  # "re-grounding", "validation", ...
    what: str  # what was left out, in words ("round 2", "3 of 6 programs: ...")
    why: str  # the estimate that did not fit the time left

    def line(self) -> str:
        return f"{self.phase}: {self.what} ({self.why})"


@dataclass
class TimeBudget:
    """`seconds` of wall clock from `started` (time.time()); phases ask for deadlines in it."""

    seconds: float
    started: float = field(default_factory=time.time)
    cuts: list[Cut] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)  # phase -> seconds from the start

    def __post_init__(self):
        if not self.seconds > 0:
            raise ConfigError(f"a time budget must be positive, got {self.seconds} s")

    @property
    def deadline(self) -> float:
        """The end of the whole budget (time.time())."""
        return self.started + self.seconds

    def elapsed(self) -> float:
        return time.time() - self.started

    def left(self, until: float | None = None) -> float:
        """Seconds left before `until` (default: the end of the budget), never negative."""
        return max(0.0, (self.deadline if until is None else until) - time.time())

    def at(self, share: float) -> float:
        """The time (time.time()) at `share` of the whole budget from its start."""
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"a share of the budget is in [0, 1], got {share}")
        return self.started + share * self.seconds

    def mark(self, phase: str) -> None:
        """Record that `phase` ended now (seconds from the start, for the report)."""
        self.marks[phase] = round(self.elapsed(), 1)

    def cut(self, phase: str, what: str, why: str) -> None:
        """Record (and log) that `phase` left `what` out because `why`."""
        entry = Cut(phase, what, why)
        self.cuts.append(entry)
        log.warning("cut for time: %s", entry.line())

    def to_json(self) -> dict:
        return {
            "seconds": self.seconds,
            "elapsed": round(self.elapsed(), 1),
            "marks": dict(self.marks),
            "cuts": [asdict(c) for c in self.cuts],
        }

    def save(self, path: Path) -> None:
        write_atomic(Path(path), json.dumps(self.to_json(), indent=1))

    def summary(self) -> str:
        """A few lines for the job's report: the budget, the time taken, each cut."""
        lines = [
            f"Time budget {self.seconds / 60:.1f} min; took {self.elapsed() / 60:.1f} min "
            + (
                "(" + ", ".join(f"{k} at {v:.0f} s" for k, v in self.marks.items()) + ")"
                if self.marks
                else ""
            )
        ]
        if self.cuts:
            lines += ["Cut for time, in the order cut:"]
            lines += [f"- {c.line()}" for c in self.cuts]
        else:
            lines += ["Nothing was cut for time."]
        return "\n".join(lines)
