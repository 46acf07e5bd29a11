"""The surrogate network's predictions as pure functions of its graph and parameters: log times
of a batch of states over a table's op slots, per ensemble member or averaged, their spread,
and the network as the environment's `LogTimeModel` (`SurrogateLogTime`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from mlirrl_jax.env.features import at_one_thread, dynamic_features, features, ops_on_one_thread
from mlirrl_jax.env.state import EnvState, ProgramTable, trim_ops, trim_table
from mlirrl_jax.surrogate.model import apply_members, apply_members_with_static, static_embeddings


def uses_loop_tokens(params) -> bool:
    """Whether a network's parameters are a loop-token network's (attention over each op's
    loops; `surrogate.model`): it has no per-program first layer to compute once per table.
    Read from the parameters, static under `jit`, since the prediction functions get no
    other description of the network."""
    return "loop_in" in params


def predict_member_log_times(
    graphdef, params, table: ProgramTable, states: EnvState, embeddings=None
) -> jax.Array:
    """(members, B) each ensemble member's predicted log times of a batch of states over all
    of `table`'s op slots (trim both first: `trim_ops`); `embeddings` are the table's
    `static_embeddings` (computed if None)."""
    if uses_loop_tokens(params):  # no separable per-program first layer
        batch = jax.vmap(features, in_axes=(None, 0))(table, states)
        return apply_members(graphdef, params, jax.lax.optimization_barrier(batch))
    # the barrier keeps XLA from fusing feature assembly into the network's layers,
    # which made the whole prediction about 1.6x slower on CPU
    batch = jax.vmap(dynamic_features, in_axes=(None, 0))(table, states)
    if embeddings is None:
        embeddings = table_embeddings(graphdef, params, table)
    # rows P.. of the embeddings are the programs at one thread: each op of a state takes
    # those where it runs outside every parallel loop (`ops_on_one_thread`)
    one = jax.vmap(ops_on_one_thread)(states)[:, : table.static_op.shape[1]]
    return apply_members_with_static(
        graphdef, params, jax.lax.optimization_barrier(batch), embeddings, states.program, one
    )


def predict_log_time(
    graphdef, params, table: ProgramTable, states: EnvState, embeddings=None
) -> jax.Array:
    """(B,) the ensemble's predicted log times (members averaged in log space) of a batch of
    states (`predict_member_log_times`)."""
    return predict_member_log_times(graphdef, params, table, states, embeddings).mean(axis=0)


def mean_and_spread(members: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ensemble's prediction and its uncertainty from (members, B) log times: their mean
    and their standard deviation across members (0 for one member)."""
    return members.mean(axis=0), members.std(axis=0)


def table_embeddings(graphdef, params, table: ProgramTable):
    """The network's per-program first-layer part for every program of `table`, then for
    every program at one thread (what an op outside every parallel loop reads): (members,
    2P, ...). None for a loop-token network, which has none."""
    if uses_loop_tokens(params):
        return None
    static_op = jnp.concatenate([table.static_op, at_one_thread(table.static_op)])
    static_loop = jnp.concatenate([table.static_loop, table.static_loop])
    return static_embeddings(graphdef, params, static_op, static_loop)


@dataclass(frozen=True)
class SurrogateLogTime:
    """The surrogate network as a `LogTimeModel` (`mlirrl_jax.env.reward`): pure functions of
    its parameter pytree, so new weights are a new argument, not a recompile."""

    graphdef: Any

    def prepare(self, params, table: ProgramTable) -> dict:
        """The parameters and the table's per-program embeddings (once per weights)."""
        cut = trim_table(table, table.op_slots)
        return {"params": params, "embeddings": table_embeddings(self.graphdef, params, cut)}

    def log_time(self, context: dict, table: ProgramTable, states: EnvState) -> jax.Array:
        cut_table, cut_states = trim_ops(table, states)
        return predict_log_time(
            self.graphdef, context["params"], cut_table, cut_states, context["embeddings"]
        )

    def log_time_with_spread(
        self, context: dict, table: ProgramTable, states: EnvState
    ) -> tuple[jax.Array, jax.Array]:
        """(B,) predicted log times, as `log_time`, and (B,) their spread across the
        ensemble's members (std of log time: the prediction's uncertainty)."""
        cut_table, cut_states = trim_ops(table, states)
        return mean_and_spread(
            predict_member_log_times(
                self.graphdef, context["params"], cut_table, cut_states, context["embeddings"]
            )
        )
