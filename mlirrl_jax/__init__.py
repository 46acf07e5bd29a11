"""mlirrl-jax: a reinforcement-learning optimizer for MLIR Linalg code.

The public API, importable from here (each loaded on first use, so that `import mlirrl_jax`
does not start JAX):

    load_program(source)            MLIR text, a .mlir path or a suite:// URI -> Program
    Schedule, Transform, Kind       what to do to each op (plain data, JSON)
    heuristic_schedule(program)     the hand-written baseline
    Runner                          compile, verify and time schedules in a worker process
    Agent                           a trained agent and its surrogate (`Agent.load(run)`)

`mlirrl_jax.optimize.optimize(path, out)` runs the agent on a kernel of your own.

The layout: docs/architecture.md.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "load_program": "mlirrl_jax.programs.ir",
    "Program": "mlirrl_jax.programs.ir",
    "Schedule": "mlirrl_jax.schedule",
    "Transform": "mlirrl_jax.schedule",
    "Kind": "mlirrl_jax.schedule",
    "heuristic_schedule": "mlirrl_jax.heuristics",
    "Runner": "mlirrl_jax.measure.runner",
    "Agent": "mlirrl_jax.agent.agent",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'mlirrl_jax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PUBLIC])
