"""What a training run asks of the rounds that correct its reward as it trains (re-grounding,
`mlirrl_jax.regrounding`): a `TrainingHook`, built per run by a `TrainingHooks` factory. JAX-free:
the protocols name what `run_training` calls, nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class TrainingHook(Protocol):
    """The reward's corrections during one run."""

    def current(self) -> Any:
        """The surrogate to train against now (an `agent.surrogate.Surrogate`)."""

    def before_last(self) -> Any | None:
        """The surrogate before the last correction (None before the first): a resumed run's
        checkpoint may have been saved against it."""

    def due(self, iteration: int) -> bool:
        """Whether a correction is due after `iteration` iterations."""

    def run_round(self, policy_params) -> Any:
        """Correct the surrogate with the policy's parameters now; returns the new one."""


class TrainingHooks(Protocol):
    """Builds a run's hook (None: no corrections) from its folder, whether it resumes, its
    agent config, training programs and prior surrogate."""

    def __call__(
        self, out: Path, resume: bool, agent_config, train_programs: list, prior
    ) -> TrainingHook | None: ...
