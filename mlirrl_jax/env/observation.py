"""EnvState -> what the agent observes: op tokens, the current op's loop tokens, the masks.

The agent's observation is versioned on its own (`OBSERVATION_VERSION`), apart from the
surrogate's features (`env/features.py`), which change whenever the surrogate does: a trained
policy keeps working across surrogate versions, and a checkpoint of a policy trained on another
observation version refuses to load. Every value is read from the `ProgramTable` and the
`EnvState`; nothing here depends on the cost model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mlirrl_jax.actions import (
    MAX_LOOPS,
    MAX_OPS,
    MAX_TILE_LEVELS,
    N_PHASES,
    N_TILE_CHOICES,
)
from mlirrl_jax.env.state import (
    ARITH_KINDS,
    CONTIGUOUS,
    MAX_OPERANDS,
    OP_KINDS,
    STRIDED,
    EnvState,
    ProgramTable,
)

# Bump when anything below changes what a policy sees: checkpoints of older versions refuse
# to load (`agent.checkpoint`).
OBSERVATION_VERSION = 4
# per op: kind, body ops, log points / work / bytes, loops, reduction loops; where the cursor
# is; its phase, tilings, parallel tile, fusion, interchange, decomposition, vectorization,
# partial tile, packed, packable, vector points; producer / consumer of the current op; its
# loops' whole and current extents; episode progress and the threads a kernel runs on (shared
# by every op)
OP_OBS = len(OP_KINDS) + len(ARITH_KINDS) + 5 + 3 + N_PHASES + 11 + 2 + 2 * MAX_LOOPS + 4
# per loop of the current op: valid, alive, reduction, sliding-window roles, whole / current /
# parallel / tile extents, position, interchange progress, how it walks each operand
LOOP_OBS = 5 + 3 + MAX_TILE_LEVELS + 3 + 3 * MAX_OPERANDS
# per tile choice: "no tiling"; log2 size and log2 share of the loop's extent, and their
# squares (a loop's weights over them can prefer mid-sized tiles); multiple of 8 and of 16
# (vector lanes), size 1; whether it divides the loop's current extent, and the share of its
# last tile a remainder leaves idle; as a parallel tile, the share of the threads its chunks
# keep busy
CANDIDATE_OBS = 11
THREADS_SCALE = 2.0  # log2 of the threads, scaled: 1 thread 0, 2 threads 0.5, 4 threads 1


@struct.dataclass
class ActionMask:
    """Legal choices of each head for the current op (the masks encode legality)."""

    kind: jax.Array  # (N_KINDS,) bool
    tile: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES) bool, for `tile`
    parallel_tile: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES) bool, for tile_parallel/tile_fuse
    pointer: jax.Array  # (MAX_LOOPS,) bool, for interchange


@struct.dataclass
class Observation:
    """One environment's observation (leading batch axes where the env is batched)."""

    ops: jax.Array  # (S, OP_OBS) float32, one token per op slot; S = the table's op_slots
    loops: jax.Array  # (MAX_LOOPS, LOOP_OBS) float32, the current op's loops
    op_valid: jax.Array  # (S,) bool
    loop_valid: jax.Array  # (MAX_LOOPS,) bool, loops of the current op that still exist
    placed: jax.Array  # (MAX_LOOPS,) bool, loops the interchange in progress has placed
    candidates: jax.Array  # (MAX_LOOPS, N_TILE_CHOICES, CANDIDATE_OBS) float32
    mask: ActionMask
    cursor: jax.Array  # () int32, the op being scheduled (-1 at the end)


def _log2(x, scale: float = 16.0) -> jax.Array:
    """log2 of positive sizes, 0 for 0 (padding / not tiled), scaled to about [0, 1]."""
    return jnp.where(x > 0, jnp.log2(jnp.maximum(x, 1).astype(jnp.float32)) + 1.0, 0.0) / scale


def current_op(state: EnvState) -> jax.Array:
    """The op being scheduled (0 once the episode is over)."""
    return jnp.maximum(state.cursor, 0)


def _op_tokens(table: ProgramTable, state: EnvState, max_steps: int) -> jax.Array:
    p, c = state.program, current_op(state)
    valid = table.loop_valid[p]
    extents = table.extents[p]
    points = jnp.prod(jnp.where(valid, extents, 1).astype(jnp.float32), axis=1)
    work = jnp.maximum(table.arith[p].sum(axis=1), 1.0) * points
    ops = jnp.arange(MAX_OPS)
    vector_points = jnp.prod(jnp.where(state.alive, state.extents, 1).astype(jnp.float32), 1)
    threads = jnp.log2(jnp.maximum(table.threads[p], 1).astype(jnp.float32)) / THREADS_SCALE
    progress = jnp.stack(
        [state.ix_count / MAX_LOOPS, state.steps / max_steps, table.n_ops[p] / MAX_OPS, threads]
    ).astype(jnp.float32)
    tokens = jnp.concatenate(
        [
            jax.nn.one_hot(table.op_kind[p], len(OP_KINDS)),
            jnp.log1p(table.arith[p]) / 4.0,
            (jnp.log2(points) / 32.0)[:, None],
            (jnp.log2(work) / 32.0)[:, None],
            (jnp.log2(table.operand_bytes[p].sum(axis=1) + 1.0) / 32.0)[:, None],
            (valid.sum(axis=1) / MAX_LOOPS)[:, None],
            ((valid & table.is_reduction[p]).sum(axis=1) / MAX_LOOPS)[:, None],
            (ops == state.cursor)[:, None],
            (ops > state.cursor)[:, None],  # already scheduled (consumers come first)
            (ops < state.cursor)[:, None],
            jax.nn.one_hot(state.phase, N_PHASES),
            (state.n_tiles / MAX_TILE_LEVELS)[:, None],
            jnp.any(state.parallel_sizes > 0, axis=1)[:, None],
            (state.fused_into >= 0)[:, None],
            state.did_fuse[:, None],
            state.interchanged[:, None],
            state.decomposed[:, None],
            state.vectorized[:, None],
            state.ragged[:, None],  # a partial last tile: `pack` no longer applies
            state.packed[:, None],
            table.packable[p][:, None],
            (jnp.log2(vector_points) / 32.0)[:, None],
            (table.fusion_consumer[p] == c)[:, None],  # a producer the current op can fuse
            (ops == table.fusion_consumer[p, c])[:, None],  # the current op's consumer
            _log2(jnp.where(valid, extents, 0)),
            _log2(jnp.where(valid, state.extents, 0)),
            jnp.broadcast_to(progress, (MAX_OPS, 4)),
        ],
        axis=1,
    ).astype(jnp.float32)
    return jnp.where(table.op_valid[p][:, None], tokens, 0.0)


def placed_loops(state: EnvState) -> jax.Array:
    """(MAX_LOOPS,) bool: the loops the interchange in progress has placed so far."""
    loops = jnp.arange(MAX_LOOPS)
    return jnp.isin(loops, jnp.where(loops < state.ix_count, state.ix_order, -1))


def _loop_tokens(table: ProgramTable, state: EnvState) -> jax.Array:
    p, c = state.program, current_op(state)
    loops = jnp.arange(MAX_LOOPS)
    valid = table.loop_valid[p, c]
    at_position = state.order[c][:, None] == loops[None, :]  # (positions, loops)
    position = jnp.sum(jnp.where(at_position, jnp.arange(MAX_LOOPS)[:, None], 0), axis=0)
    placed = placed_loops(state)
    placed_at = state.ix_order[:, None] == loops[None, :]  # (sub-steps, loops)
    placed_rank = jnp.sum(jnp.where(placed_at, jnp.arange(MAX_LOOPS)[:, None], 0), axis=0)
    access = jnp.moveaxis(table.access[p, c], 0, 1)  # (loops, operands)
    stride = jnp.moveaxis(table.stride[p, c], 0, 1)
    tokens = jnp.concatenate(
        [
            valid[:, None],
            state.alive[c][:, None],
            table.is_reduction[p, c][:, None],
            jnp.any(table.window_out[p, c][:, None] == loops, axis=0)[:, None],
            jnp.any(table.window_in[p, c][:, None] == loops, axis=0)[:, None],
            _log2(table.extents[p, c])[:, None],
            _log2(state.extents[c])[:, None],
            _log2(state.parallel_sizes[c])[:, None],
            _log2(state.tile_sizes[c].T),
            (position / MAX_LOOPS)[:, None],
            placed[:, None],
            jnp.where(placed, (placed_rank + 1) / MAX_LOOPS, 0.0)[:, None],
            access == STRIDED,
            access == CONTIGUOUS,
            jnp.where(stride > 0, jnp.log2(jnp.maximum(stride, 1.0)) / 32.0, 0.0),
        ],
        axis=1,
    ).astype(jnp.float32)
    return jnp.where(valid[:, None], tokens, 0.0)


def _candidate_features(table: ProgramTable, state: EnvState) -> jax.Array:
    p, c = state.program, current_op(state)
    whole = table.candidates[p, c]  # (loops, choices) int32
    sizes = whole.astype(jnp.float32)
    extents = jnp.maximum(state.extents[c], 1).astype(jnp.float32)[:, None]
    offered = whole > 0
    size = jnp.where(offered, jnp.log2(jnp.maximum(sizes, 1.0)) / 8.0, 0.0)
    share = jnp.where(offered, jnp.log2(jnp.maximum(sizes, 1.0) / extents) / 8.0, 0.0)
    none = jnp.broadcast_to(jnp.arange(N_TILE_CHOICES) == 0, sizes.shape)
    # a parallel tile of this size splits the loop into `chunks`, run `threads` at a time:
    # the share of the threads' turns that hold a chunk (1 at one thread)
    threads = jnp.maximum(table.threads[p], 1).astype(jnp.float32)
    chunks = jnp.ceil(extents / jnp.maximum(sizes, 1.0))
    busy = chunks / (jnp.ceil(chunks / threads) * threads)
    features = [
        none,
        size,
        size**2,
        share,
        share**2,
        offered & (whole % 8 == 0),
        offered & (whole % 16 == 0),
        whole == 1,
        # whether the tiles are whole, and how much of the last one a remainder leaves idle
        offered & (state.extents[c][:, None] % jnp.maximum(whole, 1) == 0),
        jnp.where(offered, (-extents % jnp.maximum(sizes, 1.0)) / jnp.maximum(sizes, 1.0), 0.0),
        jnp.where(offered, busy, 0.0),
    ]
    return jnp.stack([f.astype(jnp.float32) for f in features], axis=-1)


def observe(table: ProgramTable, state: EnvState, mask: ActionMask, max_steps: int) -> Observation:
    """The agent's observation of one (unbatched) state whose legal choices are `mask`.

    Op tokens cover the table's `op_slots` (its largest program's ops), not all MAX_OPS: the
    slots past them are padding in every state, and the policy's work grows with the tokens
    it reads. The network takes any number of op tokens."""
    c = current_op(state)
    slots = table.op_slots
    return Observation(
        ops=_op_tokens(table, state, max_steps)[:slots],
        loops=_loop_tokens(table, state),
        op_valid=table.op_valid[state.program][:slots],
        loop_valid=state.alive[c] & ~state.done,
        placed=placed_loops(state),
        candidates=_candidate_features(table, state),
        mask=mask,
        cursor=state.cursor,
    )
