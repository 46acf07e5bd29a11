"""EnvState -> feature arrays, in JAX: what the agent observes and what the surrogate reads.

One function for both, so training data (stored schedules replayed through `step`) and RL
states are featurized identically.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import MAX_LOOPS, MAX_OPS, MAX_TILE_LEVELS
from mlirrl_jax.env.state import (
    ARITH_KINDS,
    MACHINE_FIELDS,
    MAX_OPERANDS,
    OP_KINDS,
    EnvState,
    ProgramTable,
)

# The version of the features below: bump it when any of them changes; a saved surrogate of
# another version then refuses to load (`mlirrl_jax.surrogate.api.READABLE_VERSIONS`)
FEATURE_VERSION = 5

# valid, reduction, log extent, window out/in, access, stride and its alignment per operand
STATIC_LOOP_FEATURES = 5 + 3 * MAX_OPERANDS
# per op, the machine it runs on and its threads (`machine_features`), the same for every op
MACHINE_FEATURES = 8
# kind, body ops, valid, sizes, the machine
STATIC_OP_FEATURES = len(OP_KINDS) + len(ARITH_KINDS) + 4 + MACHINE_FEATURES
LOOP_FEATURES = STATIC_LOOP_FEATURES + 4 + MAX_TILE_LEVELS
N_LEVELS = 2 + MAX_TILE_LEVELS  # whole op, parallel tile, each tiling level (innermost last)
N_NEST = 4  # innermost loops of the whole generated loop nest described
CACHE_LINE = 64.0
# per nest loop: level one-hot, trips, reduction; per operand: strided, contiguous, bytes a step
NEST_LOOP_FEATURES = N_LEVELS + 2 + 3 * MAX_OPERANDS
# per level: footprint per operand and in all; trips per level and in all; per operand:
# contiguous extent, whether it fills whole vectors of the machine's width and the share of
# its last vector left idle; the nest's innermost loops and their working sets (per operand
# and in all); the vector code (3 per operand, registers)
LOCALITY_FEATURES = (
    N_LEVELS * (MAX_OPERANDS + 1)
    + N_LEVELS
    + 1
    + 3 * MAX_OPERANDS
    + N_NEST * (NEST_LOOP_FEATURES + MAX_OPERANDS + 1)
    + 3 * MAX_OPERANDS
    + 1
)
OP_FEATURES = STATIC_OP_FEATURES + 12 + LOCALITY_FEATURES


@struct.dataclass
class Features:
    """Shapes for MAX_OPS op slots (or the fewer slots of a trimmed table, `trim_ops`)."""

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


def machine_features(table: ProgramTable) -> jax.Array:
    """(P, MACHINE_FEATURES): each program's machine and threads, log2-scaled to about [0, 1]:
    one core's FMA peak, one thread's bandwidth, vector lanes, L1d, L2 and L3 bytes, cores,
    threads per kernel."""
    figure = dict(zip(MACHINE_FIELDS, jnp.moveaxis(table.machine, -1, 0)))

    def scaled(x, scale: float) -> jax.Array:
        return jnp.where(x > 0, jnp.log2(jnp.maximum(x, 1.0)), 0.0) / scale

    return jnp.stack(
        [
            scaled(figure["fma_peak_gflops"], 10.0),
            scaled(figure["bandwidth_gbs"], 8.0),
            scaled(table.vector_lanes.astype(jnp.float32), 5.0),
            scaled(figure["l1d_bytes"], 32.0),
            scaled(figure["l2_bytes"], 32.0),
            scaled(figure["l3_bytes"], 32.0),
            scaled(figure["cores"], 8.0),
            scaled(table.threads.astype(jnp.float32), 8.0),
        ],
        axis=-1,
    ).astype(jnp.float32)


# the static op column of the kernel's threads (the last of `machine_features`)
THREADS_COLUMN = STATIC_OP_FEATURES - 1


def ops_on_one_thread(state: EnvState) -> jax.Array:
    """(MAX_OPS,) whether each op runs outside every parallel loop: none of its own, none of
    the consumer it is fused into (nor of that one's consumer...). Such an op runs on one
    thread whatever the threads per kernel, and its features say one thread: a kernel whose
    fill alone is parallel still runs its convolution on one thread."""
    own = jnp.any(state.parallel_sizes > 0, axis=1)
    consumer = state.fused_into
    parallel = own
    for _ in range(MAX_OPS - 1):  # along chains of fused ops
        parallel = own | ((consumer >= 0) & parallel[jnp.maximum(consumer, 0)])
    return ~parallel


def at_one_thread(static_op: jax.Array) -> jax.Array:
    """Static op features (..., STATIC_OP_FEATURES) with the threads column at one thread."""
    return static_op.at[..., THREADS_COLUMN].set(0.0)


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
            jnp.broadcast_to(
                machine_features(table)[:, None, :], (*table.op_valid.shape, MACHINE_FEATURES)
            ),
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
    slots = table.fusion_consumer.shape[1]  # op slots (MAX_OPS, or fewer: `trim_ops`)
    consumer_of = table.fusion_consumer[p][:, None] == jnp.arange(slots)[None]  # (O, O)
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
    count of the loops over that level's tiles; per operand, the extent of its contiguous
    dimension in the innermost tile (the vector length it gets); the innermost loops of the
    whole loop nest the schedule generates and their working sets (`_nest_features`); and the
    vector code of a vectorized op (`_vector_code`).
    """
    p = state.program
    valid = table.loop_valid[p]
    access = table.access[p]  # (MAX_OPS, MAX_OPERANDS, MAX_LOOPS)
    used = access > 0
    full = jnp.where(valid, table.extents[p], 1).astype(jnp.float32)
    bytes_ = table.operand_bytes[p]  # (MAX_OPS, MAX_OPERANDS)
    levels = level_extents(table, state).astype(jnp.float32)
    log_levels = jnp.log2(levels)  # (L, O, LOOPS)
    log_ratio = log_levels - jnp.log2(full)[None]  # <= 0
    # bytes of operand k one tile touches: its bytes scaled by the tiled share of each loop
    footprint = jnp.log2(jnp.maximum(bytes_, 1.0))[None] + jnp.sum(
        jnp.where(used[None], log_ratio[:, :, None, :], 0.0), axis=-1
    )
    footprint = jnp.where(bytes_[None] > 0, footprint, 0.0)
    total = jnp.log2(jnp.sum(jnp.where(bytes_[None] > 0, jnp.exp2(footprint), 0.0), -1) + 1.0)
    log_points = log_levels.sum(-1)  # (L, O)
    trips = jnp.concatenate(
        [log_points[:1], log_points[:-1] - log_points[1:], (log_points[:1] - log_points[-1:])]
    )  # whole-op points, tiles per level, tiles of the innermost level in all
    inner = levels[-1]
    lanes = jnp.max(jnp.where(access == 2, inner[:, None, :], 0.0), axis=-1)  # (O, OPERANDS)
    width = table.vector_lanes[p].astype(jnp.float32)  # the machine's f32 lanes
    vector = [jnp.where(lanes > 0, jnp.log2(jnp.maximum(lanes, 1.0)) / 16.0, 0.0)]
    vector.append((lanes >= width) & (jnp.mod(lanes, width) == 0))
    padded = jnp.ceil(lanes / width) * width
    vector.append(jnp.where(lanes > 0, (padded - lanes) / jnp.maximum(padded, 1.0), 0.0))
    has_operand = bytes_ > 0
    return jnp.concatenate(
        [
            jnp.moveaxis(footprint, 0, 1).reshape(footprint.shape[1], -1) / 32.0,
            jnp.moveaxis(total, 0, 1) / 32.0,
            jnp.moveaxis(trips, 0, 1) / 32.0,
            *vector,
            _nest_features(table, state, levels, has_operand),
            _vector_code(access, log_levels[-1], has_operand & state.vectorized[:, None], width),
        ],
        axis=1,
    ).astype(jnp.float32)


def loop_positions(state: EnvState) -> jax.Array:
    """(MAX_OPS, MAX_LOOPS) float32: each original loop's position in the current order (the
    inverse of `order`; 0 for loops not placed)."""
    at_position = state.order[..., None] == jnp.arange(MAX_LOOPS)  # (O, positions, LOOPS)
    return jnp.sum(
        jnp.where(at_position, jnp.arange(MAX_LOOPS, dtype=jnp.float32)[:, None], 0.0), axis=1
    )


def _nest_features(table, state, levels, has_operand) -> jax.Array:
    """(MAX_OPS, N_NEST * (NEST_LOOP_FEATURES + MAX_OPERANDS + 1)): the innermost loops of the
    whole nest the schedule generates, innermost first, and what they touch.

    The nest is the parallel tile loops, then each tiling level's loops, then the point loops
    (none for a vectorized op: its tile is one vector operation), each level in the current loop
    order; loops of one trip do not exist. For each of the `N_NEST` innermost: its level, trip
    count, whether it is a reduction, how it walks each operand and how many bytes a step moves
    there. Then the working sets of the innermost 1..N_NEST loops: the bytes of each operand
    they touch, in whole cache lines for strided walks; it is where data is reused or not,
    whichever level the loops belong to.
    """
    p = state.program
    access = table.access[p]  # (O, OPERANDS, LOOPS)
    stride = table.stride[p]
    strided, contiguous = access == 1, access == 2
    # a loop of level l walks extents[l] in steps of extents[l + 1] (point loops: steps of 1)
    extents = jnp.concatenate([levels, jnp.ones_like(levels[:1])])  # (N_LEVELS + 1, O, LOOPS)
    point = jnp.arange(N_LEVELS)[:, None, None] == N_LEVELS - 1
    exists = (extents[:-1] > extents[1:]) & ~(point & state.vectorized[None, :, None])
    # each loop's position in the nest's levels. A decomposed op was never interchanged (only
    # named ops decompose), so its tile loops, made before the decomposition took two loops
    # out of `order`, are in the original loop order
    identity = jnp.arange(MAX_LOOPS)
    decomposed = state.decomposed[:, None]
    positions = jnp.where(decomposed, identity, loop_positions(state)).astype(jnp.uint32)
    order = jnp.where(decomposed, identity, jnp.maximum(state.order, 0))  # loop at a position
    # the nest as a 32-bit word per op, bit level * MAX_LOOPS + position set where that loop
    # exists: its highest set bits are the innermost loops (bit tricks instead of a sort)
    shift = jnp.arange(N_LEVELS, dtype=jnp.uint32)[:, None, None] * MAX_LOOPS + positions[None]
    word = jnp.sum(jnp.where(exists, jnp.uint32(1) << shift, jnp.uint32(0)), axis=(0, 2))
    element = jnp.max(jnp.where(contiguous, stride, 0.0), axis=-1)  # contiguous stride
    log_element = jnp.log2(jnp.where(element > 0, element, 4.0))  # (O, OPERANDS)
    # log2 extent of each loop the innermost loops so far cover (a vector tile to begin with);
    # per operand, the sums of it over the loops that walk the operand strided (rows) and
    # contiguously: updated one loop at a time, where the loop's cover grows
    covered = jnp.log2(jnp.where(state.vectorized[:, None], levels[-1], 1.0))  # (O, LOOPS)
    rows = jnp.sum(jnp.where(strided, covered[:, None, :], 0.0), axis=-1)  # (O, OPERANDS)
    run = jnp.sum(jnp.where(contiguous, covered[:, None, :], 0.0), axis=-1)
    loops, sets = [], []
    for _ in range(N_NEST):
        found = word > 0
        top = 31 - jax.lax.clz(jnp.where(found, word, jnp.uint32(1))).astype(jnp.int32)
        word = jnp.where(found, word & ~(jnp.uint32(1) << top.astype(jnp.uint32)), word)
        level = top // MAX_LOOPS  # (O,)
        loop = jnp.take_along_axis(order, (top % MAX_LOOPS)[:, None], axis=1)  # (O, 1)
        column = jnp.take_along_axis(extents, loop[None], axis=2)[..., 0]  # (levels + 1, O)
        rank = jnp.arange(N_LEVELS + 1)[:, None]
        walked = jnp.sum(jnp.where(rank == level, column, 0.0), axis=0)  # (O,)
        step = jnp.sum(jnp.where(rank == level + 1, column, 0.0), axis=0)
        code = jnp.take_along_axis(access, loop[:, None, :], axis=2)[..., 0]  # (O, OPERANDS)
        code = jnp.where(found[:, None], code, 0)
        moved = jnp.take_along_axis(stride, loop[:, None, :], axis=2)[..., 0] * step[:, None]
        reduction = jnp.take_along_axis(table.is_reduction[p], loop, axis=1)
        loops += [
            (level[:, None] == jnp.arange(N_LEVELS)) & found[:, None],
            jnp.where(found, jnp.log2(jnp.maximum(walked / step, 1.0)) / 16.0, 0.0)[:, None],
            reduction & found[:, None],
            code == 1,
            code == 2,
            jnp.where((code > 0) & (moved > 0), jnp.log2(jnp.maximum(moved, 1.0)) / 32.0, 0.0),
        ]
        here = jnp.arange(MAX_LOOPS) == loop  # (O, LOOPS)
        before = jnp.sum(jnp.where(here, covered, 0.0), axis=1)
        grown = jnp.where(found, jnp.maximum(jnp.log2(jnp.maximum(walked, 1.0)) - before, 0.0), 0.0)
        covered = jnp.where(here, before[:, None] + grown[:, None], covered)
        rows = rows + jnp.where(code == 1, grown[:, None], 0.0)
        run = run + jnp.where(code == 2, grown[:, None], 0.0)
        line = log_element + run
        line = jnp.where(rows > 0, jnp.maximum(line, jnp.log2(CACHE_LINE)), line)
        touched = jnp.where(has_operand, line + rows, 0.0)
        in_all = jnp.log2(jnp.sum(jnp.where(has_operand, jnp.exp2(touched), 0.0), -1) + 1.0)
        sets += [touched / 32.0, in_all[:, None] / 32.0]
    return jnp.concatenate(loops + sets, axis=1)


def _vector_code(access, log_tile, vectorized, width) -> jax.Array:
    """(MAX_OPS, 3 * MAX_OPERANDS + 1): per operand of a vectorized op, log2 of its vector's
    elements, of the 1-D transfers the lowering unrolls it into and of their length (the tile
    extent along the operand's contiguous dimension); and log2 of the registers of `width`
    lanes all its operands' vectors fill (register pressure). Zero for ops that are not
    vectorized."""
    elements = jnp.einsum("okj,oj->ok", (access > 0).astype(jnp.float32), log_tile)
    run = jnp.einsum("okj,oj->ok", (access == 2).astype(jnp.float32), log_tile)
    registers = jnp.sum(jnp.where(vectorized, jnp.ceil(jnp.exp2(elements) / width), 0.0), -1)
    parts = [elements, elements - run, run]
    return jnp.concatenate(
        [jnp.where(vectorized, x / 16.0, 0.0) for x in parts]
        + [jnp.log2(registers + 1.0)[:, None] / 16.0],
        axis=1,
    )


def dynamic_features(table: ProgramTable, state: EnvState) -> Features:
    """The schedule-dependent part of `features`: its op and loop arrays without the leading
    per-program (static) columns, which the table holds. A predictor that precomputes what it
    does with the static columns per program reads only these per state."""
    p = state.program
    loop_valid = table.loop_valid[p]
    op_valid = table.op_valid[p]
    ops = jnp.arange(state.extents.shape[0])
    positions = loop_positions(state)
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
            state.ragged,  # a partial last tile, peeled
            state.packed,
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
    per-program columns, then `dynamic_features` (padding rows are zero in both). An op
    outside every parallel loop reads as one thread (`ops_on_one_thread`)."""
    dynamic = dynamic_features(table, state)
    static_op = table.static_op[state.program]
    slots = static_op.shape[0]  # a trimmed table has fewer op slots
    one = ops_on_one_thread(state)[:slots, None]
    static_op = jnp.where(one, at_one_thread(static_op), static_op)
    return dynamic.replace(
        op_features=jnp.concatenate([static_op, dynamic.op_features], -1),
        loop_features=jnp.concatenate(
            [table.static_loop[state.program], dynamic.loop_features], -1
        ),
    )
