"""The surrogate network (Flax NNX): loops -> ops -> per-op times -> program run time.

An op reads its loops' features (extents, tiling, order, how each loop walks each operand) with
its own (kind, body, footprints per tiling level, innermost loops, vector lengths); one
self-attention layer lets ops see each other (producers, consumers, fusion); each op then gets a
predicted time per iteration point, and the program's time is the sum of its ops' times. Used
in the functional style: `nnx.split` once, then plain jit over the parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mlirrl_jax.actions import MAX_LOOPS
from mlirrl_jax.env.features import (
    LOOP_FEATURES,
    MACHINE_FEATURES,
    OP_FEATURES,
    STATIC_LOOP_FEATURES,
    STATIC_OP_FEATURES,
    Features,
)
from mlirrl_jax.surrogate.config import ModelConfig

INITIAL_LOG_SECONDS_PER_POINT = -20.7  # about 1 ns


def _masked_pool(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
    """Mean and max over `axis` of the valid entries, concatenated."""
    m = mask[..., None].astype(x.dtype)
    count = jnp.maximum(m.sum(axis=axis), 1.0)
    mean = (x * m).sum(axis=axis) / count
    largest = jnp.where(m > 0, x, -1e9).max(axis=axis)
    largest = jnp.where(count > 0, largest, 0.0) * (m.sum(axis=axis) > 0)
    return jnp.concatenate([mean, largest], axis=-1)


# the machine's columns close the static op features
MACHINE_COLUMNS = slice(STATIC_OP_FEATURES - MACHINE_FEATURES, STATIC_OP_FEATURES)


def without_machine(op_features: jax.Array) -> jax.Array:
    """Op features less the machine's columns: what a network without machine inputs reads."""
    return jnp.concatenate(
        [op_features[..., : MACHINE_COLUMNS.start], op_features[..., MACHINE_COLUMNS.stop :]],
        axis=-1,
    )


def op_inputs(machine_inputs: bool) -> int:
    """Op feature columns a network reads."""
    return OP_FEATURES if machine_inputs else OP_FEATURES - MACHINE_FEATURES


def _flattened_input_rows(machine_inputs: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the first layer's kernel (flattened-loops input) that read per-program (static)
    features, and the rows that read the schedule's (dynamic) ones."""
    ops = op_inputs(machine_inputs)
    is_static = np.zeros(ops + MAX_LOOPS * LOOP_FEATURES, bool)
    is_static[: STATIC_OP_FEATURES - (ops < OP_FEATURES) * MACHINE_FEATURES] = True
    for loop in range(MAX_LOOPS):
        start = ops + loop * LOOP_FEATURES
        is_static[start : start + STATIC_LOOP_FEATURES] = True
    return np.flatnonzero(is_static), np.flatnonzero(~is_static)


INPUT_ROWS = {m: _flattened_input_rows(m) for m in (True, False)}


class CostNet(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        lw, ow = config.loop_width, config.op_width
        if lw:
            self.loop_in = nnx.Linear(LOOP_FEATURES, lw, rngs=rngs)
            self.loop_hidden = nnx.Linear(lw, lw, rngs=rngs)
        self.loop_width = lw
        loop_inputs = 2 * lw if lw else MAX_LOOPS * LOOP_FEATURES
        self.machine_inputs = config.machine_inputs
        self.op_in = nnx.Linear(op_inputs(config.machine_inputs) + loop_inputs, ow, rngs=rngs)
        self.op_hidden = nnx.Linear(ow, ow, rngs=rngs)
        if config.heads:
            self.attention = nnx.MultiHeadAttention(
                num_heads=config.heads, in_features=ow, qkv_features=ow, decode=False, rngs=rngs
            )
        else:
            self.context = nnx.Linear(3 * ow, ow, rngs=rngs)
        self.heads = config.heads
        self.out_hidden = nnx.Linear(ow, ow, rngs=rngs)
        # per-op log seconds per iteration point; starts near 1 ns a point
        self.out = nnx.Linear(
            ow, 1, bias_init=nnx.initializers.constant(INITIAL_LOG_SECONDS_PER_POINT), rngs=rngs
        )

    def static_embedding(self, static_op: jax.Array, static_loop: jax.Array) -> jax.Array:
        """(..., MAX_OPS, op_width): the first layer's response to the per-program features
        (a `ProgramTable`'s `static_op`, `static_loop`), bias included. Computed once per
        program, it spares each state that part of the first layer (flattened loops only)."""
        if self.loop_width:
            raise ValueError("a static embedding needs the flattened-loops network (loop_width 0)")
        flat = static_loop.reshape(*static_loop.shape[:-2], -1)
        if not self.machine_inputs:
            static_op = static_op[..., : MACHINE_COLUMNS.start]
        rows = INPUT_ROWS[self.machine_inputs][0]
        kernel = self.op_in.kernel[...]
        return jnp.concatenate([static_op, flat], axis=-1) @ kernel[rows] + self.op_in.bias[...]

    def __call__(self, f: Features, static_embedding: jax.Array | None = None) -> jax.Array:
        """Predicted log run time (seconds); `f` arrays carry any leading batch axes.

        Each op gets a time (its points times a predicted time per point) and the program's
        time is their sum: a program of several ops costs what its ops cost. Given the
        program's `static_embedding`, `f` holds only the schedule's columns
        (`dynamic_features`) and only they go through the first layer.
        """
        if static_embedding is not None:
            flat = f.loop_features.reshape(*f.loop_features.shape[:-2], -1)
            dynamic = jnp.concatenate([f.op_features, flat], axis=-1)
            rows = INPUT_ROWS[self.machine_inputs][1]
            ops = nnx.relu(dynamic @ self.op_in.kernel[...][rows] + static_embedding)
        else:
            if self.loop_width:
                loops = nnx.relu(self.loop_in(f.loop_features))
                loops = nnx.relu(self.loop_hidden(loops)) + loops
                pooled = _masked_pool(loops, f.loop_valid, axis=-2)
            else:  # loops in their original order: position is meaningful, no pooling needed
                pooled = f.loop_features.reshape(*f.loop_features.shape[:-2], -1)
            op_features = f.op_features if self.machine_inputs else without_machine(f.op_features)
            ops = nnx.relu(self.op_in(jnp.concatenate([op_features, pooled], axis=-1)))
        ops = nnx.relu(self.op_hidden(ops)) + ops
        if self.heads:
            pair_mask = f.op_valid[..., None, :] & f.op_valid[..., :, None]
            ops = ops + self.attention(ops, mask=pair_mask[..., None, :, :])
        else:
            program = jnp.broadcast_to(
                _masked_pool(ops, f.op_valid, axis=-2)[..., None, :],
                (*ops.shape[:-1], 2 * ops.shape[-1]),
            )
            ops = ops + nnx.relu(self.context(jnp.concatenate([ops, program], axis=-1)))
        per_point = self.out(nnx.relu(self.out_hidden(ops)))[..., 0]
        op_log_time = jnp.where(f.op_valid, per_point + f.log_points, -jnp.inf)
        return jax.nn.logsumexp(op_log_time, axis=-1)


def build(config: ModelConfig):
    """(graphdef, params) of a fresh ensemble: one network's graph, parameters stacked on a
    leading axis of `config.members`."""
    members = [
        nnx.split(CostNet(config, nnx.Rngs(config.seed + 1000 * i)), nnx.Param)
        for i in range(max(1, config.members))
    ]
    return members[0][0], jax.tree.map(lambda *p: jnp.stack(p), *[m[1] for m in members])


def apply_members(graphdef, params, features: Features) -> jax.Array:
    """Each member's predicted log time: shape (members, *batch)."""
    return jax.vmap(lambda p: nnx.merge(graphdef, p)(features))(params)


def apply(graphdef, params, features: Features) -> jax.Array:
    """The ensemble's predicted log time (members averaged in log space)."""
    return apply_members(graphdef, params, features).mean(axis=0)


def static_embeddings(graphdef, params, static_op: jax.Array, static_loop: jax.Array):
    """Each member's `static_embedding` of a table's programs: (members, P, MAX_OPS, op_width)."""
    return jax.vmap(lambda p: nnx.merge(graphdef, p).static_embedding(static_op, static_loop))(
        params
    )


def apply_members_with_static(
    graphdef, params, features: Features, embeddings, program, one_thread=None
) -> jax.Array:
    """`apply_members` with the first layer's per-program part looked up in `embeddings` (from
    `static_embeddings`) by each row's `program` index; the same values, less work per state.
    With `one_thread` ((B, op slots) bool), `embeddings` hold the P programs and then the same
    at one thread, and each op slot takes the latter where `one_thread` says."""

    def lookup(e):
        if one_thread is None:
            return e[program]
        count = e.shape[0] // 2
        return jnp.where(one_thread[..., None], e[program + count], e[program])

    return jax.vmap(lambda p, e: nnx.merge(graphdef, p)(features, static_embedding=lookup(e)))(
        params, embeddings
    )
