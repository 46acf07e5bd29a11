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

STATIC_LOOP_FEATURES = 5 + MAX_OPERANDS  # valid, reduction, log extent, window out/in, access
STATIC_OP_FEATURES = len(OP_KINDS) + len(ARITH_KINDS) + 4  # kind, body ops, valid, sizes
LOOP_FEATURES = STATIC_LOOP_FEATURES + 4 + MAX_TILE_LEVELS
OP_FEATURES = STATIC_OP_FEATURES + 10


@struct.dataclass
class Features:
    op_features: jax.Array  # (MAX_OPS, OP_FEATURES) float32
    loop_features: jax.Array  # (MAX_OPS, MAX_LOOPS, LOOP_FEATURES) float32
    op_valid: jax.Array  # (MAX_OPS,) bool
    loop_valid: jax.Array  # (MAX_OPS, MAX_LOOPS) bool


def log2_scaled(x):
    """log2 of positive sizes, 0 for 0 (padding / not tiled); scaled to about [0, 1]."""
    return jnp.where(x > 0, jnp.log2(jnp.maximum(x, 1).astype(jnp.float32)) + 1.0, 0.0) / 16.0


def static_features(table: ProgramTable) -> tuple[jax.Array, jax.Array]:
    """The per-program part of the features, computed once when programs are encoded:
    (P, MAX_OPS, STATIC_OP_FEATURES) and (P, MAX_OPS, MAX_LOOPS, STATIC_LOOP_FEATURES)."""
    loops = jnp.arange(MAX_LOOPS)
    window_out = jnp.any(table.window_out[..., None] == loops, axis=-2)
    window_in = jnp.any(table.window_in[..., None] == loops, axis=-2)
    loop = jnp.concatenate(
        [
            table.loop_valid[..., None],
            table.is_reduction[..., None],
            log2_scaled(table.extents)[..., None],
            window_out[..., None],
            window_in[..., None],
            jnp.moveaxis(table.access, -2, -1) / 2.0,
        ],
        axis=-1,
    ).astype(jnp.float32)
    points = jnp.prod(jnp.where(table.loop_valid, table.extents, 1).astype(jnp.float32), axis=-1)
    work = jnp.maximum(table.arith.sum(axis=-1), 1.0) * points
    op = jnp.concatenate(
        [
            jax.nn.one_hot(table.op_kind, len(OP_KINDS)),
            jnp.log1p(table.arith),
            table.op_valid[..., None],
            (jnp.log2(points) / 32.0)[..., None],
            (jnp.log2(work) / 32.0)[..., None],
            (jnp.log2(table.operand_bytes.sum(axis=-1) + 1.0) / 32.0)[..., None],
        ],
        axis=-1,
    ).astype(jnp.float32)
    return jnp.where(table.op_valid[..., None], op, 0.0), jnp.where(
        table.loop_valid[..., None], loop, 0.0
    )


def features(table: ProgramTable, state: EnvState) -> Features:
    """Per-op and per-loop features of one environment's program and schedule."""
    p = state.program
    loop_valid = table.loop_valid[p]
    op_valid = table.op_valid[p]
    ops = jnp.arange(MAX_OPS)
    # position of each loop in the current order (the inverse of `order`)
    slots = jnp.where(state.order >= 0, state.order, MAX_LOOPS)
    positions = (
        jnp.zeros((MAX_OPS, MAX_LOOPS + 1))
        .at[ops[:, None], slots]
        .set(jnp.arange(MAX_LOOPS, dtype=jnp.float32))[:, :MAX_LOOPS]
    )
    dynamic_loop = jnp.concatenate(
        [
            state.alive[..., None],
            log2_scaled(state.extents)[..., None],
            (positions / MAX_LOOPS)[..., None],
            log2_scaled(state.parallel_sizes)[..., None],
            log2_scaled(jnp.moveaxis(state.tile_sizes, 1, 2)),
        ],
        axis=-1,
    ).astype(jnp.float32)
    loop = jnp.concatenate([table.static_loop[p], dynamic_loop], axis=-1)
    loop = jnp.where(loop_valid[..., None], loop, 0.0)
    vector_points = jnp.prod(jnp.where(state.alive, state.extents, 1).astype(jnp.float32), axis=1)
    dynamic_op = jnp.stack(
        [
            ops == state.cursor,
            ops > state.cursor,  # already scheduled (consumers come first)
            jnp.any(state.parallel_sizes > 0, axis=1),
            jnp.sum(jnp.any(state.tile_sizes > 0, axis=2), axis=1) / MAX_TILE_LEVELS,
            state.fused_into >= 0,
            state.did_fuse,
            state.interchanged,
            state.decomposed,
            state.vectorized,
            jnp.log2(vector_points) / 32.0,
        ],
        axis=1,
    ).astype(jnp.float32)
    op = jnp.concatenate([table.static_op[p], dynamic_op], axis=1)
    op = jnp.where(op_valid[:, None], op, 0.0)
    return Features(op, loop, op_valid, loop_valid)
