"""What a round measures (`Planned`), and the cut of a plan larger than the round's allowance
(`CUT_ORDER`, `within_budget`)."""

from __future__ import annotations

from dataclasses import dataclass

from mlirrl_jax.programs.ir import Program
from mlirrl_jax.schedule import Schedule


@dataclass
class Planned:
    """One measurement a round asks for."""

    program: Program
    schedule: Schedule
    role: str  # learn | baseline | track | heldout | heuristic | calibration | validation
    predicted_speedup: float | None = None

    def to_json(self) -> dict:
        return {
            "program": self.program.name,
            "program_hash": self.program.hash,
            "schedule": self.schedule.to_json(),
            "schedule_hash": self.schedule.hash,
            "role": self.role,
            "predicted_speedup": self.predicted_speedup,
        }

    @property
    def key(self) -> tuple[str, str]:
        return self.program.hash, self.schedule.hash


# the order in which a plan over its allowance is cut: what scores the surrogate first, what
# the round learns from last
CUT_ORDER = ("validation", "calibration", "heuristic", "heldout", "track", "learn")


def priority(planned: list[Planned]) -> list[int]:
    """The indices of the plan's schedules but baselines, the most needed first: by role
    (`CUT_ORDER` reversed), then by rank within the program (the agent's best first), then as
    planned."""
    rank, seen = [], {}
    for p in planned:
        rank.append(seen.get((p.role, p.program.hash), 0))
        seen[(p.role, p.program.hash)] = rank[-1] + 1
    needed = {role: i for i, role in enumerate(reversed(CUT_ORDER))}
    chosen = [i for i, p in enumerate(planned) if p.role != "baseline"]
    return sorted(chosen, key=lambda i: (needed[planned[i].role], rank[i]))


def within_budget(
    planned: list[Planned], stored: set[tuple[str, str]], allowance: int
) -> tuple[list[Planned], dict]:
    """The plan cut to `allowance` new measurements, most needed first (`priority`): a
    schedule stays if it and its program's baseline, where the store (`stored`) lacks them,
    still fit. A program's baseline stays while one of its schedules does. Returns the plan
    kept and {"allowance", "wanted": new measurements of the whole plan, "planned": those
    kept, "cut": entries cut per role}."""
    baseline = Schedule().hash
    kept_keys: set[tuple[str, str]] = set()
    kept: set[int] = set()
    cut: dict[str, int] = {}
    left = allowance
    for i in priority(planned):
        p = planned[i]
        new = {p.key, (p.program.hash, baseline)} - stored - kept_keys
        if len(new) <= left:
            kept.add(i)
            kept_keys |= new
            left -= len(new)
        else:
            cut[p.role] = cut.get(p.role, 0) + 1
    programs = {planned[i].program.hash for i in kept}
    for i, p in enumerate(planned):
        if p.role == "baseline":
            if p.program.hash in programs:
                kept.add(i)
            else:
                cut["baseline"] = cut.get("baseline", 0) + 1
    wanted = len({p.key for p in planned} - stored)
    record = {"allowance": allowance, "wanted": wanted, "planned": allowance - left, "cut": cut}
    return [p for i, p in enumerate(planned) if i in kept], record
