"""A surrogate that reads the schedule as a sequence of transformation tokens (after TLP).

The shipped network reads engineered features: footprints per tiling level, working sets of
the innermost loops, vector codes (`env.features.locality_features`). This model reads none of
them. Each op becomes a short sequence of tokens, one per step of the schedule applied to it,
each carrying that step's raw parameters over the op's loops:

    op      the op's own description (kind, body, sizes) and the machine's profile
    loops   its loops as the program states them (extent, reduction, access per operand)
    parallel  the tile sizes of its `scf.forall` (log2 per loop), fused or not
    tile i  the tile sizes of tiling level i, and whether a tile is partial
    order   each loop's position after interchange
    flags   decomposed, vectorized, packed

A step the schedule did not take is masked out, so the sequence is as long as the schedule.
Self-attention runs over an op's steps, then across ops; each op gets a time per iteration
point and the program's time is the sum of its ops' times, as in `surrogate.model.CostNet`.
The tokens are a pure function of the environment's state (`tokens`), so the model can run
as the reward under `jit`.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
from flax import nnx, struct

from mlirrl_jax.actions import MAX_LOOPS, MAX_TILE_LEVELS
from mlirrl_jax.env.features import (
    STATIC_LOOP_FEATURES,
    STATIC_OP_FEATURES,
    at_one_thread,
    log2_scaled,
    loop_positions,
    ops_on_one_thread,
)
from mlirrl_jax.env.state import EnvState, ProgramTable
from mlirrl_jax.surrogate.dataset import map_in_chunks
from mlirrl_jax.surrogate.model import INITIAL_LOG_SECONDS_PER_POINT, _masked_pool

# op, loops, parallel, each tiling level, order, flags
STEP_NAMES = ("op", "loops", "parallel", *(f"tile{i}" for i in range(MAX_TILE_LEVELS)))
STEP_NAMES = (*STEP_NAMES, "order", "flags")
N_STEPS = len(STEP_NAMES)


@struct.dataclass
class Tokens:
    """One state's tokens; every array has the op slots first (a trimmed table: fewer)."""

    op: jax.Array  # (MAX_OPS, STATIC_OP_FEATURES)
    loops: jax.Array  # (MAX_OPS, MAX_LOOPS * STATIC_LOOP_FEATURES)
    parallel: jax.Array  # (MAX_OPS, MAX_LOOPS + 2)
    tiles: jax.Array  # (MAX_OPS, MAX_TILE_LEVELS, MAX_LOOPS + 1)
    order: jax.Array  # (MAX_OPS, MAX_LOOPS + 1)
    flags: jax.Array  # (MAX_OPS, 3)
    present: jax.Array  # (MAX_OPS, N_STEPS) bool: the steps the schedule took (op, loops: all)
    op_valid: jax.Array  # (MAX_OPS,) bool
    log_points: jax.Array  # (MAX_OPS,) float32, natural log of the op's iteration points


def tokens(table: ProgramTable, state: EnvState) -> Tokens:
    """The token sequence of one state (no batch axis; `jax.vmap` it)."""
    p = state.program
    op_valid = table.op_valid[p]
    loop_valid = table.loop_valid[p]
    slots = op_valid.shape[0]
    static_op = table.static_op[p]
    # an op outside every parallel loop runs on one thread whatever the kernel's threads
    static_op = jnp.where(
        ops_on_one_thread(state)[:slots, None], at_one_thread(static_op), static_op
    )
    loops = table.static_loop[p].reshape(slots, MAX_LOOPS * STATIC_LOOP_FEATURES)
    parallel_sizes = state.parallel_sizes[:slots]
    tile_sizes = state.tile_sizes[:slots]
    on_loops = lambda x: jnp.where(loop_valid, x, 0.0)  # noqa: E731
    parallel = jnp.concatenate(
        [
            on_loops(log2_scaled(parallel_sizes)),
            (state.fused_into[:slots] >= 0)[:, None],
            state.did_fuse[:slots, None],
        ],
        axis=-1,
    )
    tiles = jnp.concatenate(
        [
            jnp.where(loop_valid[:, None, :], log2_scaled(tile_sizes), 0.0),
            jnp.broadcast_to(state.ragged[:slots, None, None], (slots, MAX_TILE_LEVELS, 1)),
        ],
        axis=-1,
    )
    order = jnp.concatenate(
        [
            on_loops(loop_positions(state)[:slots] / MAX_LOOPS),
            state.interchanged[:slots, None],
        ],
        axis=-1,
    )
    flags = jnp.stack(
        [state.decomposed[:slots], state.vectorized[:slots], state.packed[:slots]], axis=-1
    )
    taken = jnp.concatenate(
        [
            jnp.ones((slots, 2), bool),
            jnp.any(parallel_sizes > 0, axis=-1)[:, None],
            jnp.any(tile_sizes > 0, axis=-1),
            state.interchanged[:slots, None],
            jnp.any(flags, axis=-1)[:, None],
        ],
        axis=-1,
    )
    log_points = jnp.sum(jnp.where(loop_valid, jnp.log(jnp.maximum(table.extents[p], 1)), 0.0), 1)
    valid = op_valid[:, None]
    return Tokens(
        op=jnp.where(valid, static_op, 0.0),
        loops=jnp.where(valid, loops, 0.0),
        parallel=jnp.where(valid, parallel, 0.0).astype(jnp.float32),
        tiles=jnp.where(valid[..., None], tiles, 0.0).astype(jnp.float32),
        order=jnp.where(valid, order, 0.0).astype(jnp.float32),
        flags=jnp.where(valid, flags, False).astype(jnp.float32),
        present=taken & valid,
        op_valid=op_valid,
        log_points=log_points.astype(jnp.float32),
    )


@dataclass(frozen=True)
class TokenConfig:
    width: int = 48  # token size
    heads: int = 2  # attention heads, over an op's steps and across ops
    members: int = 1
    seed: int = 0

    def to_json(self) -> dict:
        return asdict(self)


class TokenNet(nnx.Module):
    def __init__(self, config: TokenConfig, rngs: nnx.Rngs):
        w = config.width
        sizes = {
            "op": STATIC_OP_FEATURES,
            "loops": MAX_LOOPS * STATIC_LOOP_FEATURES,
            "parallel": MAX_LOOPS + 2,
            "tile": MAX_LOOPS + 1,
            "order": MAX_LOOPS + 1,
            "flags": 3,
        }
        # one embedding per kind of step: its bias is the step's identity
        self.embed = nnx.Dict({k: nnx.Linear(n, w, rngs=rngs) for k, n in sizes.items()})
        self.level = nnx.Param(jnp.zeros((MAX_TILE_LEVELS, w)))  # which tiling level
        self.steps_attention = nnx.MultiHeadAttention(
            num_heads=config.heads, in_features=w, qkv_features=w, decode=False, rngs=rngs
        )
        self.steps_hidden = nnx.Linear(w, w, rngs=rngs)
        self.op_in = nnx.Linear(2 * w, w, rngs=rngs)
        self.ops_attention = nnx.MultiHeadAttention(
            num_heads=config.heads, in_features=w, qkv_features=w, decode=False, rngs=rngs
        )
        self.out_hidden = nnx.Linear(w, w, rngs=rngs)
        self.out = nnx.Linear(
            w, 1, bias_init=nnx.initializers.constant(INITIAL_LOG_SECONDS_PER_POINT), rngs=rngs
        )

    def __call__(self, t: Tokens) -> jax.Array:
        """Predicted log run time (seconds); `t` arrays carry any leading batch axes."""
        e = self.embed
        tiles = nnx.relu(e["tile"](t.tiles) + self.level[...])
        steps = jnp.concatenate(
            [
                nnx.relu(e["op"](t.op))[..., None, :],
                nnx.relu(e["loops"](t.loops))[..., None, :],
                nnx.relu(e["parallel"](t.parallel))[..., None, :],
                tiles,
                nnx.relu(e["order"](t.order))[..., None, :],
                nnx.relu(e["flags"](t.flags))[..., None, :],
            ],
            axis=-2,
        )  # (..., ops, N_STEPS, width)
        pair = t.present[..., None, :] & t.present[..., :, None]
        steps = steps + self.steps_attention(steps, mask=pair[..., None, :, :])
        steps = steps + nnx.relu(self.steps_hidden(steps))
        ops = nnx.relu(self.op_in(_masked_pool(steps, t.present, axis=-2)))
        op_pair = t.op_valid[..., None, :] & t.op_valid[..., :, None]
        ops = ops + self.ops_attention(ops, mask=op_pair[..., None, :, :])
        per_point = self.out(nnx.relu(self.out_hidden(ops)))[..., 0]
        op_log_time = jnp.where(t.op_valid, per_point + t.log_points, -jnp.inf)
        return jax.nn.logsumexp(op_log_time, axis=-1)


def build_tokens(config: TokenConfig):
    """(graphdef, params) of a fresh ensemble of token networks, parameters stacked on a
    leading axis of `config.members` (as `surrogate.model.build`)."""
    members = [
        nnx.split(TokenNet(config, nnx.Rngs(config.seed + 1000 * i)), nnx.Param)
        for i in range(max(1, config.members))
    ]
    return members[0][0], jax.tree.map(lambda *p: jnp.stack(p), *[m[1] for m in members])


@jax.jit
def _tokens_of_chunk(table: ProgramTable, states: EnvState) -> Tokens:
    return jax.vmap(tokens, in_axes=(None, 0))(table, states)


def tokens_of_states(table: ProgramTable, states: EnvState) -> Tokens:
    """Tokens of a batch of states (leading axis N), as NumPy arrays (jitted once per table
    shape, in chunks)."""
    return map_in_chunks(functools.partial(_tokens_of_chunk, table), states, size=4096)
