"""The validation's settings (`ValidationConfig`) and the searches it compares the agent with."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlirrl_jax.agent.config import STARTS
from mlirrl_jax.errors import Error
from mlirrl_jax.measure.runner import DEFAULT_MEM_LIMIT_MB
from mlirrl_jax.strategies.base import parse_methods
from mlirrl_jax.util.configs import option

log = logging.getLogger(__name__)


MATMUL_KINDS = ("matmul", "batch_matmul")


class ValidationError(Error, ValueError):
    """Bad validation input (a setting, a program beyond the environment's limits)."""


@dataclass(frozen=True)
class ValidationConfig:
    """What a validation measures and how.

    Its fields are declared alike, each documented (`util.configs.option`): the flags and
    their help come from them (`cli.options`).
    """

    threads: tuple[int, ...] = (1, 2)
    budget: int = option(
        8, doc="k: the agent's and the guided search's measured schedules per program"
    )
    random_factor: int = option(8, doc="the larger random search: random_factor * k measurements")
    guided_samples: int = option(
        256, doc="random schedules the surrogate ranks for `surrogate_topk`"
    )
    evolutionary_budget: int = option(
        0, doc="real measurements of the evolutionary search (0: not run)"
    )
    agent_start: str = option(
        "known",
        doc=(
            "the agent's top-k: \"known\" (the heuristic's schedule, refinements of it and the "
            "agent's own, with the agent's own alone measured beside it as "
            '`agent_scratch_topk`) or "scratch"'
        ),
    )
    xla: bool = option(True, doc="XLA:CPU (jax.jit of the program) measured too")
    numpy: bool = option(True, doc="NumPy/BLAS measured too, where it has the op")
    seed: int = 0
    timeout_s: float = 60.0
    mem_limit_mb: int = DEFAULT_MEM_LIMIT_MB
    store: str | None = option(None, doc="also put every kernel measurement in this store")
    also: str = option(
        "",
        doc="strategies measured beside the default ones, comma-separated (`mlirrl_jax.strategies`)",
    )

    @property
    def also_methods(self) -> tuple:
        return parse_methods(self.also)

    def __post_init__(self):
        if not self.threads or any(int(t) != t or t < 1 for t in self.threads):
            raise ValidationError(f"threads must be whole numbers >= 1, got {self.threads}")
        if len(set(self.threads)) != len(self.threads):
            raise ValidationError(f"threads repeat: {self.threads}")
        if self.budget < 1:
            raise ValidationError(f"budget must be at least 1, got {self.budget}")
        if self.random_factor < 1:
            raise ValidationError(f"random_factor must be at least 1, got {self.random_factor}")
        if self.guided_samples < self.budget:
            raise ValidationError(
                f"guided_samples ({self.guided_samples}) must be at least the budget "
                f"({self.budget})"
            )
        if self.timeout_s <= 0:
            raise ValidationError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.agent_start not in STARTS:
            raise ValidationError(
                f"agent_start {self.agent_start!r}: expected one of {', '.join(STARTS)}"
            )
        self.also_methods  # noqa: B018 (a name that is no method's is refused here)
        if self.evolutionary_budget < 0:
            raise ValidationError(
                f"evolutionary_budget must be at least 0, got {self.evolutionary_budget}"
            )
