"""The reward model an agent trains against, by name: the shipped surrogate, a saved one, or
the analytic stand-in. The one place the agent reaches into `mlirrl_jax.surrogate` (lazily): the rest of
the agent sees only a `LogTimeModel` and its parameter pytree."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlirrl_jax.env.reward import AnalyticLogTime, LogTimeModel
from mlirrl_jax.shipped import SHIPPED_SURROGATE

log = logging.getLogger(__name__)

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
    fitted_machines: tuple[str, ...] = ()  # the machines of the rows it was fitted or updated on

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
        suites=model.suites or DEFAULT_SUITES,
        path=str(path.resolve()),
        fitted_threads=model.thread_counts,
        fitted_machines=model.machines,
    )


def transfer_score(surrogate: Surrogate) -> str:
    """What the surrogate's own fit records of how it predicts for a machine it was not fitted
    on (`metrics.json`'s `leave_one_machine_out` scores), in words."""
    metrics_file = Path(surrogate.path) / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    left_out = metrics.get("leave_one_machine_out")
    if left_out:
        return (
            f"with a machine left out of its fit it scored Spearman {left_out['spearman']:.2f}, "
            f"MAPE {left_out['mape_speedup']:.0%} there"
        )
    held_out = metrics.get("surrogate")
    on_its_machines = (
        f" (its held-out Spearman {held_out['spearman']:.2f} is on those machines)"
        if held_out
        else ""
    )
    return f"no score of it on a machine left out of its fit is recorded{on_its_machines}"


def check_this_machine(
    surrogate: Surrogate, threads: Iterable[int], threads_flag: str = "--threads"
) -> None:
    """Warn, one line each, where the surrogate's predictions here are beyond what it was
    fitted on: this machine not among its machines (with how well it is known to transfer and
    how to adapt it), or a thread count above the cores this process may run on or outside
    the surrogate's thread counts."""
    from mlirrl_jax.host_devices import available_cores
    from mlirrl_jax.measure.fingerprint import machine_fingerprint

    fitted = surrogate.identity.get("kind") != ANALYTIC  # the stand-in was fitted on nothing
    here = machine_fingerprint()["machine_id"]
    if fitted and here not in surrogate.fitted_machines:
        log.warning(
            "warning: this machine (%s) is not among the machines the surrogate %s was fitted "
            "on (%s): %s. Adapt it to this machine: `make demo`, or `mlirrl-jax train --out RUN "
            "--rounds N`",
            here,
            surrogate.path,
            ", ".join(surrogate.fitted_machines),
            transfer_score(surrogate),
        )
    cores = available_cores()
    for count in sorted(set(threads)):
        if count > cores:
            log.warning(
                "warning: %s %d is more than the %d cores this process may run on: the "
                "kernel's threads share cores",
                threads_flag,
                count,
                cores,
            )
        if fitted and count not in surrogate.thread_counts:
            log.warning(
                "warning: %s %d: the surrogate was fitted at %s thread(s) only, so its "
                "predictions at %d are extrapolated",
                threads_flag,
                count,
                ", ".join(map(str, surrogate.thread_counts)),
                count,
            )
