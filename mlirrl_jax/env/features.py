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

# valid, reduction, log extent, window out/in, access, stride and its alignment per operand
STATIC_LOOP_FEATURES = 5 + 3 * MAX_OPERANDS
STATIC_OP_FEATURES = len(OP_KINDS) + len(ARITH_KINDS) + 4  # kind, body ops, valid, sizes
LOOP_FEATURES = STATIC_LOOP_FEATURES + 4 + MAX_TILE_LEVELS
N_LEVELS = 2 + MAX_TILE_LEVELS  # whole op, parallel tile, each tiling level (innermost last)
N_INNER = 2  # innermost loops of the point nest described
N_WORKING_SETS = 3  # working sets of the innermost 1, 2, 3 loops of the point nest
CACHE_LINE = 64.0
# per level: footprint per operand and in all; trips per level and in all; per inner loop:
# access code one-hot, stride and its alignment per operand, reduction, extent; none left; per
# operand: contiguous extent and whether it fills whole 8-lane vectors
LOCALITY_FEATURES = (
    N_LEVELS * (MAX_OPERANDS + 1)
    + N_LEVELS
    + 1
    + N_INNER * (5 * MAX_OPERANDS + 2)
    + 1
    + 2 * MAX_OPERANDS
    + N_WORKING_SETS * (MAX_OPERANDS + 1)
)
OP_FEATURES = STATIC_OP_FEATURES + 10 + LOCALITY_FEATURES


@struct.dataclass
class Features:
    op_features: jax.Array  # (MAX_OPS, OP_FEATURES) float32
    loop_features: jax.Array  # (MAX_OPS, MAX_LOOPS, LOOP_FEATURES) float32
    op_valid: jax.Array  # (MAX_OPS,) bool
    loop_valid: jax.Array  # (MAX_OPS, MAX_LOOPS) bool
    log_points: jax.Array  # (MAX_OPS,) float32, natural log of the op's iteration points


def log2_scaled(x):
    """log2 of positive sizes, 0 for 0 (padding / not tiled); scaled to about [0, 1]."""
    return jnp.where(x > 0, jnp.log2(jnp.maximum(x, 1).astype(jnp.float32)) + 1.0, 0.0) / 16.0


def stride_features(stride: jax.Array) -> jax.Array:
    """(..., 2): log2 of a byte stride, and its power-of-two alignment (cache set aliasing)."""
    s = jnp.maximum(stride, 1.0)
    # trailing zero bits of the stride: large ones map successive steps to few cache sets
    whole = jnp.minimum(s, 2.0**30).astype(jnp.int32)
    aligned = jnp.minimum(jnp.log2((whole & -whole).astype(jnp.float32)), 16.0)
    return jnp.where(
        stride[..., None] > 0, jnp.stack([jnp.log2(s) / 32.0, aligned / 16.0], axis=-1), 0.0
    )


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
            jnp.moveaxis(stride_features(table.stride), -3, -2).reshape(
                *table.stride.shape[:2], MAX_LOOPS, 2 * MAX_OPERANDS
            ),
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


def level_extents(table: ProgramTable, state: EnvState) -> jax.Array:
    """(N_LEVELS, MAX_OPS, MAX_LOOPS) loop extents of each level of the tiled loop nest.

    Level 0 is the whole op (for a fused producer: the slice its consumer's tile needs), level
    1 the parallel tile, then each tiling level; the last equals the state's current extents.
    """
    p = state.program
    full = jnp.where(table.loop_valid[p], table.extents[p], 1)
    # selections by one-hot masks rather than gathers: much cheaper under vmap on CPU
    consumer_of = table.fusion_consumer[p][:, None] == jnp.arange(MAX_OPS)[None]  # (O, O)
    loop_map = table.fusion_loop_map[p]
    mapped = loop_map[..., None] == jnp.arange(MAX_LOOPS)  # (O, LOOPS, consumer LOOPS)
    fused = (state.fused_into >= 0)[:, None] & (loop_map >= 0)
    parallel = jnp.where(state.parallel_sizes > 0, state.parallel_sizes, full)
    whole = full
    for _ in range(2):  # a fused producer sees its consumer's tile (chains of three)
        consumer_tile = jnp.sum(jnp.where(consumer_of[:, :, None], parallel[None], 0), axis=1)
        from_consumer = jnp.sum(jnp.where(mapped, consumer_tile[:, None, :], 0), axis=-1)
        whole = jnp.where(fused, jnp.minimum(from_consumer, full), full)
        parallel = jnp.where(state.parallel_sizes > 0, state.parallel_sizes, whole)
    levels = [whole, parallel]
    for level in range(MAX_TILE_LEVELS):
        sizes = state.tile_sizes[:, level]
        levels.append(jnp.where(sizes > 0, jnp.minimum(sizes, levels[-1]), levels[-1]))
    return jnp.stack(levels)


def locality_features(table: ProgramTable, state: EnvState) -> jax.Array:
    """(MAX_OPS, LOCALITY_FEATURES): what the schedule does to data reuse and vector code.

    Per level of the loop nest, the bytes of each operand one tile touches (log2) and the trip
    count of the loops over that level's tiles; the two innermost loops of the point nest, how
    they walk each operand and with what byte stride; per operand, the extent of its contiguous
    dimension in the innermost tile (the vector length it gets); the working sets of the
    innermost loops (`_working_sets`).
    """
    p = state.program
    valid = table.loop_valid[p]
    access = table.access[p]  # (MAX_OPS, MAX_OPERANDS, MAX_LOOPS)
    strides = table.stride[p]
    used = access > 0
    full = jnp.where(valid, table.extents[p], 1).astype(jnp.float32)
    bytes_ = table.operand_bytes[p]  # (MAX_OPS, MAX_OPERANDS)
    levels = level_extents(table, state).astype(jnp.float32)
    log_ratio = jnp.log2(levels / full[None])  # (L, O, LOOPS) <= 0
    # bytes of operand k one tile touches: its bytes scaled by the tiled share of each loop
    footprint = jnp.log2(jnp.maximum(bytes_, 1.0))[None] + jnp.sum(
        jnp.where(used[None], log_ratio[:, :, None, :], 0.0), axis=-1
    )
    footprint = jnp.where(bytes_[None] > 0, footprint, 0.0)
    total = jnp.log2(jnp.sum(jnp.where(bytes_[None] > 0, jnp.exp2(footprint), 0.0), -1) + 1.0)
    log_points = jnp.log2(levels).sum(-1)  # (L, O)
    trips = jnp.concatenate(
        [log_points[:1], log_points[:-1] - log_points[1:], (log_points[:1] - log_points[-1:])]
    )  # whole-op points, tiles per level, tiles of the innermost level in all
    # the innermost loops of the point nest: last positions of `order` whose extent is > 1
    inner = levels[-1]
    at_position = state.order[..., None] == jnp.arange(MAX_LOOPS)  # (O, positions, LOOPS)
    live_loop = state.alive & (inner > 1)
    live = jnp.any(at_position & live_loop[:, None, :], axis=-1)  # (O, positions)
    positions = jnp.where(live, jnp.arange(MAX_LOOPS)[None], -1)
    ranked = _innermost(positions, max(N_INNER, N_WORKING_SETS))  # live positions, innermost first
    inner_parts = []
    for r in range(N_INNER):
        exists = ranked[:, r] >= 0
        sel = _loops_at(at_position, ranked[:, r])  # (O, LOOPS)
        code = jnp.sum(jnp.where(sel[:, None, :], access, 0), axis=-1)  # (O, OPERANDS)
        one_hot = jax.nn.one_hot(code, 3).reshape(MAX_OPS, -1)
        stride = jnp.sum(jnp.where(sel[:, None, :], strides, 0.0), axis=-1)
        extent = jnp.sum(jnp.where(sel, inner, 0.0), axis=1)
        inner_parts += [
            jnp.where(exists[:, None], one_hot, 0.0),
            jnp.where(exists[:, None], stride_features(stride).reshape(MAX_OPS, -1), 0.0),
            (exists & jnp.any(sel & table.is_reduction[p], axis=1))[:, None],
            jnp.where(exists, jnp.log2(jnp.maximum(extent, 1.0)) / 16.0, 0.0)[:, None],
        ]
    nothing_left = (ranked[:, 0] < 0)[:, None]
    working_sets = _working_sets(access, strides, bytes_ > 0, inner, at_position, ranked)
    contiguous = access == 2
    lanes = jnp.max(jnp.where(contiguous, inner[:, None, :], 0.0), axis=-1)  # (O, OPERANDS)
    vector = [jnp.where(lanes > 0, jnp.log2(jnp.maximum(lanes, 1.0)) / 16.0, 0.0)]
    vector.append((lanes >= 8) & (jnp.mod(lanes, 8) == 0))
    return jnp.concatenate(
        [
            jnp.moveaxis(footprint, 0, 1).reshape(MAX_OPS, -1) / 32.0,
            jnp.moveaxis(total, 0, 1) / 32.0,
            jnp.moveaxis(trips, 0, 1) / 32.0,
            *inner_parts,
            nothing_left,
            *vector,
            working_sets,
        ],
        axis=1,
    ).astype(jnp.float32)


def _innermost(positions: jax.Array, count: int) -> jax.Array:
    """(O, count): the `count` largest entries of each row of `positions` (-1 = none), largest
    first; rows hold distinct values or -1, so repeated maxima replace a sort."""
    ranked, below = [], jnp.full(positions.shape[:1], MAX_LOOPS)
    for _ in range(count):
        below = jnp.max(jnp.where(positions < below[:, None], positions, -1), axis=1)
        ranked.append(below)
    return jnp.stack(ranked, axis=1)


def _loops_at(at_position: jax.Array, position: jax.Array) -> jax.Array:
    """(O, LOOPS) one-hot of the loop at `position` (O,) of each op's order; none for -1."""
    here = position[:, None] == jnp.arange(MAX_LOOPS)[None]  # (O, positions)
    return jnp.any(at_position & here[..., None], axis=1)


def _working_sets(access, stride, used, inner, at_position, ranked) -> jax.Array:
    """(MAX_OPS, N_WORKING_SETS * (MAX_OPERANDS + 1)): log2 bytes the innermost r loops of the
    point nest touch, per operand and in all, counting whole cache lines for strided walks: how
    far apart reuses are, which tiling levels alone do not say (an untiled nest, a loop order)."""
    element = jnp.max(jnp.where(access == 2, stride, 0.0), axis=-1)  # contiguous stride
    element = jnp.where(element > 0, element, 4.0)
    log_extent = jnp.log2(jnp.maximum(inner, 1.0))  # (MAX_OPS, MAX_LOOPS)
    out = []
    in_set = jnp.zeros(inner.shape, bool)
    for r in range(N_WORKING_SETS):
        in_set = in_set | _loops_at(at_position, ranked[:, r])
        strided = (access == 1) & in_set[:, None, :]
        contiguous = (access == 2) & in_set[:, None, :]
        rows = jnp.sum(jnp.where(strided, log_extent[:, None, :], 0.0), axis=-1)
        row = jnp.log2(element) + jnp.sum(jnp.where(contiguous, log_extent[:, None, :], 0.0), -1)
        row = jnp.where(jnp.any(strided, -1), jnp.maximum(row, jnp.log2(CACHE_LINE)), row)
        footprint = jnp.where(used, rows + row, 0.0)
        total = jnp.log2(jnp.sum(jnp.where(used, jnp.exp2(footprint), 0.0), -1) + 1.0)
        out += [footprint / 32.0, total[:, None] / 32.0]
    return jnp.concatenate(out, axis=1)


def dynamic_features(table: ProgramTable, state: EnvState) -> Features:
    """The schedule-dependent part of `features`: its op and loop arrays without the leading
    per-program (static) columns, which the table holds. A predictor that precomputes what it
    does with the static columns per program reads only these per state."""
    p = state.program
    loop_valid = table.loop_valid[p]
    op_valid = table.op_valid[p]
    ops = jnp.arange(MAX_OPS)
    # position of each loop in the current order (the inverse of `order`), 0 if not placed
    at_position = state.order[..., None] == jnp.arange(MAX_LOOPS)  # (O, positions, LOOPS)
    positions = jnp.sum(
        jnp.where(at_position, jnp.arange(MAX_LOOPS, dtype=jnp.float32)[:, None], 0.0), axis=1
    )
    loop = jnp.concatenate(
        [
            state.alive[..., None],
            log2_scaled(state.extents)[..., None],
            (positions / MAX_LOOPS)[..., None],
            log2_scaled(state.parallel_sizes)[..., None],
            log2_scaled(jnp.moveaxis(state.tile_sizes, 1, 2)),
        ],
        axis=-1,
    ).astype(jnp.float32)
    loop = jnp.where(loop_valid[..., None], loop, 0.0)
    vector_points = jnp.prod(jnp.where(state.alive, state.extents, 1).astype(jnp.float32), axis=1)
    flags = jnp.stack(
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
    op = jnp.concatenate([flags, locality_features(table, state)], axis=1)
    op = jnp.where(op_valid[:, None], op, 0.0)
    log_points = jnp.sum(jnp.where(loop_valid, jnp.log(jnp.maximum(table.extents[p], 1)), 0.0), 1)
    return Features(op, loop, op_valid, loop_valid, log_points.astype(jnp.float32))


def features(table: ProgramTable, state: EnvState) -> Features:
    """Per-op and per-loop features of one environment's program and schedule: the table's
    per-program columns, then `dynamic_features` (padding rows are zero in both)."""
    dynamic = dynamic_features(table, state)
    return dynamic.replace(
        op_features=jnp.concatenate([table.static_op[state.program], dynamic.op_features], -1),
        loop_features=jnp.concatenate(
            [table.static_loop[state.program], dynamic.loop_features], -1
        ),
    )
