"""The surrogate network (Flax NNX): loops -> ops -> program -> predicted log run time.

Each loop is a token (its extents, tiling, order, how it walks each operand); an op pools its
loop tokens (masked mean and max) with its own features; one self-attention layer lets ops see
each other (producers, consumers, fusion); the pooled ops give the prediction. Used in the
functional style: `nnx.split` once, then plain jit over the parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from mlirrl_jax.actions import MAX_LOOPS
from mlirrl_jax.env.features import LOOP_FEATURES, OP_FEATURES, Features


@dataclass(frozen=True)
class ModelConfig:
    loop_width: int = 0  # loop token size (0: an op reads its loops' features flattened)
    op_width: int = 32  # op token size
    heads: int = 2  # attention heads across ops (0: ops exchange a pooled context instead)
    seed: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def _masked_pool(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
    """Mean and max over `axis` of the valid entries, concatenated."""
    m = mask[..., None].astype(x.dtype)
    count = jnp.maximum(m.sum(axis=axis), 1.0)
    mean = (x * m).sum(axis=axis) / count
    largest = jnp.where(m > 0, x, -1e9).max(axis=axis)
    largest = jnp.where(count > 0, largest, 0.0) * (m.sum(axis=axis) > 0)
    return jnp.concatenate([mean, largest], axis=-1)


class CostNet(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        lw, ow = config.loop_width, config.op_width
        if lw:
            self.loop_in = nnx.Linear(LOOP_FEATURES, lw, rngs=rngs)
            self.loop_hidden = nnx.Linear(lw, lw, rngs=rngs)
        self.loop_width = lw
        loop_inputs = 2 * lw if lw else MAX_LOOPS * LOOP_FEATURES
        self.op_in = nnx.Linear(OP_FEATURES + loop_inputs, ow, rngs=rngs)
        self.op_hidden = nnx.Linear(ow, ow, rngs=rngs)
        if config.heads:
            self.attention = nnx.MultiHeadAttention(
                num_heads=config.heads, in_features=ow, qkv_features=ow, decode=False, rngs=rngs
            )
        else:
            self.context = nnx.Linear(3 * ow, ow, rngs=rngs)
        self.heads = config.heads
        self.out_hidden = nnx.Linear(2 * ow, ow, rngs=rngs)
        self.out = nnx.Linear(ow, 1, rngs=rngs)

    def __call__(self, f: Features) -> jax.Array:
        """Predicted (standardized) log time; `f` arrays carry any leading batch axes."""
        if self.loop_width:
            loops = nnx.relu(self.loop_in(f.loop_features))
            loops = nnx.relu(self.loop_hidden(loops)) + loops
            pooled = _masked_pool(loops, f.loop_valid, axis=-2)
        else:  # loops are in their original order: position is meaningful, pooling not needed
            pooled = f.loop_features.reshape(*f.loop_features.shape[:-2], -1)
        ops = nnx.relu(self.op_in(jnp.concatenate([f.op_features, pooled], axis=-1)))
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
        program = _masked_pool(ops, f.op_valid, axis=-2)
        return self.out(nnx.relu(self.out_hidden(program)))[..., 0]


def build(config: ModelConfig):
    """(graphdef, params) of a fresh network."""
    return nnx.split(CostNet(config, nnx.Rngs(config.seed)), nnx.Param)


def apply(graphdef, params, features: Features) -> jax.Array:
    return nnx.merge(graphdef, params)(features)
