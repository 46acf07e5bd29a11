"""EnvState -> feature arrays, in JAX: what the agent observes and what the surrogate reads.

One function for both, so training data (stored schedules replayed through `step`) and RL
states are featurized identically.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, MAX_TILE_LEVELS
from mlirrl_jax.env.state import ARITH_KINDS, MAX_OPERANDS, OP_KINDS, EnvState, ProgramTable

LOOP_FEATURES = 9 + MAX_TILE_LEVELS + MAX_OPERANDS
OP_FEATURES = len(OP_KINDS) + len(ARITH_KINDS) + 14


@struct.dataclass
class Features:
    op_features: jax.Array  # (MAX_OPS, OP_FEATURES) float32
    loop_features: jax.Array  # (MAX_OPS, MAX_LOOPS, LOOP_FEATURES) float32
    op_valid: jax.Array  # (MAX_OPS,) bool
    loop_valid: jax.Array  # (MAX_OPS, MAX_LOOPS) bool


def _log2(x: jax.Array) -> jax.Array:
    """log2 of positive sizes, 0 for 0 (padding / not tiled); scaled to about [0, 1]."""
    return jnp.where(x > 0, jnp.log2(jnp.maximum(x, 1).astype(jnp.float32)) + 1.0, 0.0) / 16.0


def features(table: ProgramTable, state: EnvState) -> Features:
    """Per-op and per-loop features of one environment's program and schedule."""
    p = state.program
    full = table.extents[p]
    loop_valid = table.loop_valid[p]
    op_valid = table.op_valid[p]
    positions = jnp.argsort(jnp.where(state.order >= 0, state.order, MAX_LOOPS), axis=1)
    loop = jnp.concatenate(
        [
            loop_valid[..., None],
            state.alive[..., None],
            table.is_reduction[p][..., None],
            _log2(full)[..., None],
            _log2(state.extents)[..., None],
            (positions / MAX_LOOPS)[..., None],
            _log2(state.parallel_sizes)[..., None],
            jnp.isin(jnp.arange(MAX_LOOPS), table.window_out[p]).astype(jnp.float32)[None, :, None]
            * jnp.ones((MAX_OPS, 1, 1)),
            jnp.isin(jnp.arange(MAX_LOOPS), table.window_in[p]).astype(jnp.float32)[None, :, None]
            * jnp.ones((MAX_OPS, 1, 1)),
            _log2(jnp.moveaxis(state.tile_sizes, 1, 2)),
            jnp.moveaxis(table.access[p], 1, 2) / 2.0,
        ],
        axis=-1,
    ).astype(jnp.float32)
    loop = jnp.where(loop_valid[..., None], loop, 0.0)
    ops = jnp.arange(MAX_OPS)
    points = jnp.prod(jnp.where(loop_valid, full, 1).astype(jnp.float32), axis=1)
    vector_points = jnp.prod(jnp.where(state.alive, state.extents, 1).astype(jnp.float32), axis=1)
    arith = table.arith[p]
    op = jnp.concatenate(
        [
            jax.nn.one_hot(table.op_kind[p], len(OP_KINDS)),
            jnp.log1p(arith),
            jnp.stack(
                [
                    op_valid,
                    ops == state.cursor,
                    ops > state.cursor,  # already scheduled (consumers come first)
                    jnp.any(state.parallel_sizes > 0, axis=1),
                    jnp.sum(jnp.any(state.tile_sizes > 0, axis=2), axis=1) / MAX_TILE_LEVELS,
                    state.fused_into >= 0,
                    state.did_fuse,
                    state.interchanged,
                    state.decomposed,
                    state.vectorized,
                    jnp.log2(points) / 32.0,
                    jnp.log2(jnp.maximum(arith.sum(axis=1), 1.0) * points) / 32.0,
                    jnp.log2(table.operand_bytes[p].sum(axis=1) + 1.0) / 32.0,
                    jnp.log2(vector_points) / 32.0,
                ],
                axis=1,
            ).astype(jnp.float32),
        ],
        axis=1,
    ).astype(jnp.float32)
    op = jnp.where(op_valid[:, None], op, 0.0)
    return Features(op, loop, op_valid, loop_valid)
