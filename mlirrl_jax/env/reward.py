"""Rewards as pure functions of a cost model's parameters.

A cost model enters the environment as a `LogTimeModel`: `prepare(params, table)` does the
per-program work once for a parameter pytree (the surrogate's first-layer embeddings, say), and
`log_time(context, table, states)` predicts a batch of states. A reward is built on one:
`TerminalReward` pays the predicted log-speedup when an episode ends, `ShapedReward` pays each
step's decrease of predicted log time (potential-based: undiscounted, the two give a finished
episode the same return). Both
take `RewardParams` from their `prepare`, so a fine-tuned surrogate is a new argument to a
jitted function, not a recompile; the environment never imports the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.env.analytic import analytic_log_time
from mlirrl_jax.env.state import EnvState, ProgramTable, initial_state

BASELINE_CHUNK = 256  # programs per step when `prepare` predicts every unscheduled program


class LogTimeModel(Protocol):
    """A cost model as pure functions of its parameters."""

    def prepare(self, params: Any, table: ProgramTable) -> Any:
        """The model's context for `table`: its parameters plus per-program precomputation."""

    def log_time(self, context: Any, table: ProgramTable, states: EnvState) -> jax.Array:
        """(B,) predicted natural-log run times (seconds) of a batch of states."""


@dataclass(frozen=True)
class AnalyticLogTime:
    """The roofline stand-in (`env/analytic.py`) as a `LogTimeModel`; it has no parameters.
    `threads` 0 reads each program's thread count from the table."""

    threads: int = 0

    def prepare(self, params: Any, table: ProgramTable) -> Any:
        return ()

    def log_time(self, context: Any, table: ProgramTable, states: EnvState) -> jax.Array:
        return jax.vmap(lambda s: analytic_log_time(table, s, self.threads))(states)


@dataclass(frozen=True)
class PessimisticLogTime:
    """A model's log time plus `beta` times its ensemble's spread (the std of its members' log
    times): a pessimistic estimate, so that a schedule the surrogate is unsure of counts as
    slower and the agent does not seek out the surrogate's mistakes. `model` must give
    `log_time_with_spread` (the surrogate does; one network's spread is 0)."""

    model: Any
    beta: float

    def prepare(self, params: Any, table: ProgramTable) -> Any:
        return self.model.prepare(params, table)

    def log_time(self, context: Any, table: ProgramTable, states: EnvState) -> jax.Array:
        mean, spread = self.model.log_time_with_spread(context, table, states)
        return mean + self.beta * spread


@struct.dataclass
class RewardParams:
    """What a reward reads: the model's context and every program's unscheduled time."""

    context: Any
    base_log_time: jax.Array  # (P,) float32, predicted log time of each unscheduled program


def baseline_log_times(model: LogTimeModel, context: Any, table: ProgramTable) -> jax.Array:
    """(P,) predicted log time of every program of `table` unscheduled (chunked)."""
    count = table.n_programs
    padded = -(-count // BASELINE_CHUNK) * BASELINE_CHUNK
    programs = jnp.arange(padded, dtype=jnp.int32) % count
    key = jax.random.PRNGKey(0)
    states = jax.vmap(lambda p: initial_state(table, p, key))(programs)
    chunks = jax.tree.map(lambda a: a.reshape(-1, BASELINE_CHUNK, *a.shape[1:]), states)
    times = jax.lax.map(lambda part: model.log_time(context, table, part), chunks)
    return times.reshape(padded)[:count].astype(jnp.float32)


def evaluate_where(fn, needed: jax.Array, states: EnvState, chunk: int) -> jax.Array:
    """`fn(states) -> (B,)` computed only for the rows where `needed`, `chunk` rows at a time
    (0 elsewhere): the needed rows are gathered to the front and a while loop runs as many
    chunks as they fill, so the work follows the count, not the batch."""
    rows = needed.shape[0]
    if rows <= chunk:
        return jnp.where(needed, fn(states), 0.0)
    padded = -(-rows // chunk) * chunk
    # out-of-range fill: gathers clamp it, the scatter drops it
    index = jnp.nonzero(needed, size=padded, fill_value=rows)[0]
    count = needed.sum()

    def body(carry):
        i, out = carry
        at = jax.lax.dynamic_slice(index, (i * chunk,), (chunk,))
        part = jax.tree.map(lambda a: a[jnp.minimum(at, rows - 1)], states)
        return i + 1, out.at[at].set(fn(part).astype(out.dtype), mode="drop")

    out = jnp.zeros(rows, jnp.float32)
    return jax.lax.while_loop(lambda c: c[0] * chunk < count, body, (0, out))[1]


@dataclass(frozen=True)
class Reward:
    """A reward over a `LogTimeModel`; subclasses say when the model is consulted."""

    model: LogTimeModel = AnalyticLogTime()
    chunk: int = 64  # states the model predicts at a time

    def prepare(self, params: Any, table: ProgramTable) -> RewardParams:
        """The reward's parameters for the model's `params` on `table` (jittable)."""
        context = self.model.prepare(params, table)
        return RewardParams(context, baseline_log_times(self.model, context, table))

    def __call__(
        self,
        params: RewardParams,
        table: ProgramTable,
        before: EnvState,
        action: jax.Array,
        after: EnvState,
    ) -> tuple[jax.Array, jax.Array]:
        """(B,) rewards of a batch of transitions, and (B,) the predicted log time of each
        `after` state where the model was consulted (else `before.log_time`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class TerminalReward(Reward):
    """The predicted log-speedup of the finished schedule, paid when the episode ends; the
    model runs only on the states that just ended."""

    def __call__(self, params, table, before, action, after):
        ended = after.done & ~before.done

        def predict(states):
            return self.model.log_time(params.context, table, states)

        log_time = evaluate_where(predict, ended, after, self.chunk)
        reward = jnp.where(ended, params.base_log_time[after.program] - log_time, 0.0)
        return reward, jnp.where(ended, log_time, before.log_time)


@dataclass(frozen=True)
class ShapedReward(Reward):
    """Each step's decrease of predicted log time (summed over a finished episode: its
    predicted log-speedup, as `TerminalReward` pays); the model runs on every state."""

    def __call__(self, params, table, before, action, after):
        log_time = self.model.log_time(params.context, table, after).astype(jnp.float32)
        log_time = jnp.where(before.done, before.log_time, log_time)
        return before.log_time - log_time, log_time
