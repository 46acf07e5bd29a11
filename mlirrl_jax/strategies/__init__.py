"""Search strategies: every way the project chooses schedules to measure, one module each.

`base` defines the `Method` names, the `Strategy` protocol, its typed `Candidate` and `Trial`
and `measure_candidates`; every other module here registers one or more strategies. Adding a
strategy is a member of `Method` and a module in this package (`refined` is a small example).
"""

from mlirrl_jax.strategies.base import (
    Candidate,
    Measured,
    Method,
    Proposer,
    Proposing,
    Searcher,
    Searching,
    Strategy,
    Trial,
    best_trial,
    measure_candidates,
    parse_methods,
    registry,
)

__all__ = [
    "Candidate",
    "Measured",
    "Method",
    "Proposer",
    "Proposing",
    "Searcher",
    "Searching",
    "Strategy",
    "Trial",
    "best_trial",
    "measure_candidates",
    "parse_methods",
    "registry",
]
