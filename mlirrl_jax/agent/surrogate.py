"""The reward model an agent trains against, by name: the shipped surrogate, a saved one, or
the analytic stand-in. The one place the agent reaches into `mlirrl_jax.surrogate` (lazily): the rest of
the agent sees only a `LogTimeModel` and its parameter pytree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlirrl_jax.env.reward import AnalyticLogTime, LogTimeModel
from mlirrl_jax.shipped import SHIPPED_SURROGATE

ANALYTIC = "analytic"
# the suites the shipped surrogates were fitted on, for a checkpoint that does not say
DEFAULT_SUITES = ("dl-v0", "shapes-v0", "shapes-v1", "shapes-v2")


@dataclass(frozen=True)
class Surrogate:
    """A reward model: pure functions, their parameters, and what names them."""

    model: LogTimeModel
    params: Any
    identity: dict
    suites: tuple[str, ...]  # the suites whose train split it was fitted on (or trains on)
    path: str = ""
    fitted_threads: tuple[int, ...] = ()  # the thread counts of the rows it was fitted on

    @property
    def machine_id(self) -> str:
        return self.identity.get("machine_id", "")

    @property
    def threads(self) -> int:
        """The threads per kernel of the rows it was last fitted or updated on."""
        return int(self.identity.get("threads", 1))

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """Every thread count its rows held (its predictions are measured ones only there)."""
        return self.fitted_threads or (self.threads,)


def load_surrogate(spec: str = "") -> Surrogate:
    """`spec`: "" (the shipped surrogate), "analytic", or a saved cost model's folder (its
    files checked against its manifest: `CostModel.load`)."""
    if spec == ANALYTIC:
        return Surrogate(AnalyticLogTime(), (), {"kind": ANALYTIC}, DEFAULT_SUITES, ANALYTIC)
    from mlirrl_jax.surrogate.api import CostModel

    path = Path(spec) if spec else SHIPPED_SURROGATE
    model = CostModel.load(path)
    return Surrogate(
        model=model.log_time_model,
        params=model.params,
        identity={"kind": "surrogate", "path": str(path.resolve()), **model.identity},
        suites=tuple(model.meta.get("suites") or DEFAULT_SUITES),
        path=str(path.resolve()),
        fitted_threads=tuple(sorted(int(t) for t in model.meta.get("thread_counts") or ())),
    )
