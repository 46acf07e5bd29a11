"""How a training run re-grounds its surrogate (`RegroundConfig`), and the choices its rounds make."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from mlirrl_jax.errors import ConfigError
from mlirrl_jax.shipped import default_store
from mlirrl_jax.util.configs import option

SELECTIONS = ("uncertain_gain", "gain", "uniform")
UPDATES = ("measured", "anchored", "residual")


def uncertain_gain_order(gain: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Indices of programs, the largest claim first: the agent's predicted log-gain over the
    heuristic (none counted below 0) times the surrogate ensemble's spread on its schedule;
    programs that claim nothing follow, by their gain."""
    claim = np.maximum(gain, 0.0) * spread
    return np.lexsort((-gain, -claim))


@dataclass(frozen=True)
class RegroundConfig:
    """How a training run re-grounds its surrogate; saved as `regrounding/config.json`. Its
    fields are documented one by one, as `AgentConfig`'s: the flags and their help come from
    them (`cli.options`)."""

    rounds: int = option(6, doc="Re-grounding rounds in the run (0: simulated training only).")
    iterations_per_round: int = option(
        60,
        doc=(
            "PPO iterations before each round and after the last (K): a run given no budget "
            "of its own trains (rounds + 1) x K."
        ),
    )
    round_programs: int = option(
        16, doc="Training programs whose top schedules a round measures (P)."
    )
    top_k: int = option(
        8, doc="Distinct schedules per program, the agent's best by the surrogate (k)."
    )
    real_budget: int = option(
        2000,
        doc=(
            "Real measurements the run may make in all, a hard cap (baselines, calibration, "
            "validation and tracking included; what the store already has costs nothing)."
        ),
    )
    selection: str = option(
        "uncertain_gain",
        doc=(
            'How a round picks its programs: "uncertain_gain" (largest predicted gain of the '
            "agent's greedy schedule over the heuristic times the ensemble's spread on it: "
            "where the surrogate claims much and is unsure of it; programs with no predicted "
            'gain last, by gain), "gain" (largest predicted gain) or "uniform".'
        ),
    )
    update: str = option(
        "residual",
        doc=(
            'What an update learns from: "measured" (this machine\'s rows alone), "anchored" '
            '(plus random states of the same programs labeled by the prior) or "residual" '
            "(plus random states labeled by the prior corrected by small trees fitted on this"
            " machine's rows to what the prior gets wrong there); anchor states: "
            "`anchor_share` per measured row."
        ),
    )
    anchor_share: float = option(
        0.5, doc='With `update="anchored"`: anchor states per measured row.'
    )
    update_epochs: int = option(20, doc="Passes over the rows in each update.")
    held_back: float = option(
        0.25, doc="Share of a round's programs kept out of its update, to score it after."
    )
    track_programs: int = option(
        12, doc="Fixed training programs whose greedy schedules are measured every round."
    )
    heldout_programs: int = option(
        12,
        doc="Test programs (dl-v0) whose greedy and heuristic schedules are measured for real.",
    )
    heldout_every: int = option(
        2, doc="Rounds between two measurements of the held-out programs (and at the last round)."
    )
    calibration_programs: int = option(
        24,
        doc=(
            "Round 1 on a machine without its own rows: training programs measured for their "
            "baseline, the agent's greedy schedule and `calibration_k` random schedules."
        ),
    )
    calibration_k: int = option(
        0, doc="Random schedules per calibration program (as collection samples them)."
    )
    validation_programs: int = option(
        16,
        doc="Surrogate-validation programs measured once, to score the surrogate on this machine.",
    )
    validation_k: int = option(
        8,
        doc=(
            "Random schedules per validation program (as collection samples them), besides "
            "the baseline."
        ),
    )
    max_mflops: float = option(
        400.0, doc="Only programs of at most this many MFLOP are measured (a measurement's time)."
    )
    store: str = option(
        factory=default_store,
        doc="The measurement store; only this machine's rows are read and written.",
    )
    threads: int = option(
        1,
        doc=(
            "Threads per measured kernel: the rounds measure, learn from and track only this "
            "machine's rows at this thread count, so a run adapts its surrogate and agent to "
            "it."
        ),
    )
    workers: int = option(2, doc="Measurements in flight at once (each in its own worker process).")
    timeout_s: float = option(60.0, doc="A measurement running longer is recorded as a timeout.")
    seed: int = option(0, doc="Fixes the program choice and the sampled schedules.")

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ConfigError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.update not in UPDATES:
            raise ConfigError(f"update must be one of {UPDATES}, got {self.update!r}")
        for name in ("iterations_per_round", "round_programs", "top_k", "workers", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rounds", "real_budget", "track_programs", "heldout_programs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.held_back < 1.0:
            raise ConfigError(f"held_back must be in [0, 1), got {self.held_back}")

    def run_iterations(self) -> int:
        """The iterations of a run given no budget: K before each round and K after the last."""
        return (self.rounds + 1) * self.iterations_per_round

    def check_iterations(self, iterations: int) -> None:
        """Refuses an iteration budget that ends before the last round (0, a time budget,
        passes)."""
        last = self.rounds * self.iterations_per_round
        if 0 < iterations <= last:
            raise ConfigError(
                f"--iterations {iterations} reaches {(iterations - 1) // self.iterations_per_round}"
                f" of the {self.rounds} re-grounding rounds (the last comes after iteration "
                f"{last}): give --iterations {last + 1} or more, or leave it out to train "
                f"(rounds + 1) x iterations per round = {self.run_iterations()}"
            )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RegroundConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown re-grounding keys {unknown}; known: {sorted(known)}")
        return cls(**data)
