"""The policy and value network (Flax NNX) and the action distribution it defines.

Encoders: one token per op; the current op's token reads all of them (so the op being
scheduled sees the others); one token per loop of the current op, which also reads the current
op's token, mixed so that the loops see each other. Mixing is attention or a deep set (a token
reads the mean and max of the set).

Heads, one per action sub-space (`actions.py`), each masked by the observation's masks:
- the kind head, a categorical over the transformation kinds;
- a tile head per loop, a categorical over that loop's tile candidates, conditioned on the
  chosen kind and masked with the tile mask that kind reads (`actions.TILES_OF`);
- the level pointer, a pointer network: a query from the current op and the loops placed so
  far scores each loop token, masked to the loops not yet placed;
- the value head.

The kind comes first and the tile heads read it, so an action's probability is the kind's
times the probabilities of the heads that kind uses (`actions.USES_TILES`, `USES_POINTER`):
its log-probability and entropy sum over those heads only. Logits are soft-capped to
+-`LOGIT_CAP` and a masked choice gets `MASKED` (finite, so entropies stay finite): its
probability is exactly 0, however large the network's outputs grow.

Used in the functional style: `nnx.split` once, then plain `jit` over the parameter pytree.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from mlirrl_jax.actions import (
    N_KINDS,
    USES_POINTER,
    USES_TILES,
)
from mlirrl_jax.agent.config import NetworkConfig
from mlirrl_jax.env.jax_env import tile_mask_of
from mlirrl_jax.env.observation import CANDIDATE_OBS, LOOP_OBS, OP_OBS, Observation

MASKED = -1e9
CONTEXT = 5  # the context's width in tokens: the current op, the ops' and loops' mean and max
LOGIT_CAP = 30.0  # logits are soft-capped to +-30, so MASKED lies far below every legal one


def _masked_mean_max(x: jax.Array, valid: jax.Array) -> jax.Array:
    """(..., 2 * width): mean and max over the token axis (-2) of the valid tokens."""
    weight = valid[..., None].astype(x.dtype)
    count = jnp.maximum(weight.sum(axis=-2), 1.0)
    mean = (x * weight).sum(axis=-2) / count
    largest = jnp.where(weight > 0, x, MASKED).max(axis=-2)
    largest = jnp.where(weight.sum(axis=-2) > 0, largest, 0.0)
    return jnp.concatenate([mean, largest], axis=-1)


class TokenMixer(nnx.Module):
    """Query tokens that read a set of tokens: a residual attention or deep-set layer, then an
    MLP. With the set's own tokens as the queries, the tokens see each other."""

    def __init__(self, config: NetworkConfig, rngs: nnx.Rngs):
        width = config.width
        self.attend = config.mixing == "attention"
        if self.attend:
            self.attention = nnx.MultiHeadAttention(
                num_heads=config.heads,
                in_features=width,
                qkv_features=width,
                decode=False,
                rngs=rngs,
            )
        else:  # Linear([query, pooled set]) split in two: the pooled half once per set
            self.own = nnx.Linear(width, width, rngs=rngs)
            self.pooled = nnx.Linear(2 * width, width, use_bias=False, rngs=rngs)
        self.hidden = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, tokens: jax.Array, valid: jax.Array, queries=None) -> jax.Array:
        """tokens (..., N, width) with valid (..., N); queries (..., Q, width), default the
        tokens themselves (then invalid ones come back as 0)."""
        own = tokens if queries is None else queries
        if self.attend:
            mask = jnp.broadcast_to(valid[..., None, :], (*own.shape[:-1], valid.shape[-1]))
            mixed = own + self.attention(own, tokens, mask=mask[..., None, :, :])
        else:
            pooled = self.pooled(_masked_mean_max(tokens, valid))[..., None, :]
            mixed = own + nnx.relu(self.own(own) + pooled)
        mixed = mixed + nnx.relu(self.hidden(mixed))
        return jnp.where(valid[..., None], mixed, 0.0) if queries is None else mixed


@struct.dataclass
class Encoding:
    """What the heads read: the current op's token, the program's and loops' summaries, and
    the current op's loop tokens."""

    context: jax.Array  # (..., CONTEXT * width): current op; mean, max of ops; of loops
    loops: jax.Array  # (..., MAX_LOOPS, width)


class PolicyNetwork(nnx.Module):
    def __init__(self, config: NetworkConfig, rngs: nnx.Rngs):
        width = config.width
        self.width = width
        self.op_in = nnx.Linear(OP_OBS, width, rngs=rngs)
        self.op_mixer = TokenMixer(config, rngs)
        self.loop_in = nnx.Linear(LOOP_OBS, width, rngs=rngs)
        self.loop_current = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.loop_mixer = TokenMixer(config, rngs)
        self.kind_hidden = nnx.Linear(CONTEXT * width, width, rngs=rngs)
        self.kind_out = nnx.Linear(width, N_KINDS, rngs=rngs)
        self.kind_embedding = nnx.Embed(N_KINDS, width, rngs=rngs)
        self.tile_query = nnx.Linear(width, CANDIDATE_OBS, rngs=rngs)
        self.pointer_query = nnx.Linear((CONTEXT + 1) * width, width, rngs=rngs)
        self.value_hidden = nnx.Linear(CONTEXT * width, width, rngs=rngs)
        self.value_out = nnx.Linear(width, 1, rngs=rngs)

    def encode(self, obs: Observation) -> Encoding:
        # the op being scheduled reads the whole program's ops (the heads read only it and
        # the pooled ops, so only its token is mixed)
        ops = jnp.where(obs.op_valid[..., None], nnx.relu(self.op_in(obs.ops)), 0.0)
        cursor = jnp.maximum(obs.cursor, 0)
        current = jnp.take_along_axis(ops, cursor[..., None, None], axis=-2)
        current = self.op_mixer(ops, obs.op_valid, queries=current)[..., 0, :]
        # each loop reads the current op's token: Linear([loop, current]) split in two
        loops = nnx.relu(self.loop_in(obs.loops) + self.loop_current(current)[..., None, :])
        loops = self.loop_mixer(loops, obs.loop_valid)
        context = jnp.concatenate(
            [current, _masked_mean_max(ops, obs.op_valid), _masked_mean_max(loops, obs.loop_valid)],
            axis=-1,
        )
        return Encoding(context, loops)

    def kind_logits(self, encoding: Encoding) -> jax.Array:
        return self.kind_out(nnx.relu(self.kind_hidden(encoding.context)))

    def tile_logits(self, encoding: Encoding, obs: Observation, kind: jax.Array) -> jax.Array:
        """(..., MAX_LOOPS, N_TILE_CHOICES): per loop, weights of its candidates' features
        (size, share of the loop, their squares, vector-lane fits: `CANDIDATE_OBS`) read
        from its token and the chosen kind; a candidate's logit is their weighted sum."""
        query = self.tile_query(encoding.loops + self.kind_embedding(kind)[..., None, :])
        return jnp.einsum("...lf,...lcf->...lc", query, obs.candidates)

    def pointer_logits(self, encoding: Encoding, obs: Observation) -> jax.Array:
        """(..., MAX_LOOPS): a query from the current op and the loops placed so far, against
        each loop's token (the keys)."""
        placed = _masked_mean_max(encoding.loops, obs.placed)[..., : self.width]
        query = self.pointer_query(jnp.concatenate([encoding.context, placed], axis=-1))
        return jnp.einsum("...d,...ld->...l", query, encoding.loops) / math.sqrt(self.width)

    def value(self, encoding: Encoding) -> jax.Array:
        return self.value_out(nnx.relu(self.value_hidden(encoding.context)))[..., 0]


def abstract(config: NetworkConfig):
    """(graphdef, the parameters' shapes) of the network, nothing computed."""
    return nnx.split(nnx.eval_shape(lambda: PolicyNetwork(config, nnx.Rngs(0))), nnx.Param)


def build(config: NetworkConfig, seed: int = 0):
    """(graphdef, params) of a fresh network (initialized under jit: one compile instead of
    one per layer)."""
    params = jax.jit(lambda: nnx.split(PolicyNetwork(config, nnx.Rngs(seed)), nnx.Param)[1])()
    return abstract(config)[0], params


def _masked(logits: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, LOGIT_CAP * jnp.tanh(logits / LOGIT_CAP), MASKED)


def _log_prob_entropy(logits: jax.Array, choice: jax.Array) -> tuple[jax.Array, jax.Array]:
    log_p = jax.nn.log_softmax(logits, axis=-1)
    taken = jnp.take_along_axis(log_p, choice[..., None], axis=-1)[..., 0]
    return taken, -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


@struct.dataclass
class ActionDistribution:
    """The masked logits of every head for one kind (arrays with leading batch axes)."""

    kind: jax.Array  # (..., N_KINDS)
    tiles: jax.Array  # (..., MAX_LOOPS, N_TILE_CHOICES), for the kind they were computed for
    pointer: jax.Array  # (..., MAX_LOOPS)


def distribution(
    network: PolicyNetwork, encoding: Encoding, obs: Observation, kind
) -> ActionDistribution:
    """The heads' masked logits, the tile heads conditioned on `kind`."""
    return ActionDistribution(
        kind=_masked(network.kind_logits(encoding), obs.mask.kind),
        tiles=_masked(network.tile_logits(encoding, obs, kind), tile_mask_of(obs.mask, kind)),
        pointer=_masked(network.pointer_logits(encoding, obs), obs.mask.pointer),
    )


def log_prob_entropy(dist: ActionDistribution, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """An action's log-probability, summed over the heads its kind uses, and the entropy the
    bonus uses: the kind head's plus the entropies of the heads this action's kind uses
    (a one-sample estimate of the autoregressive policy's entropy)."""
    kind, pointer, tiles = action[..., 0], action[..., 1], action[..., 2:]
    kind_lp, kind_ent = _log_prob_entropy(dist.kind, kind)
    tile_lp, tile_ent = _log_prob_entropy(dist.tiles, tiles)
    pointer_lp, pointer_ent = _log_prob_entropy(dist.pointer, pointer)
    uses_tiles = jnp.asarray(USES_TILES)[kind]
    uses_pointer = jnp.asarray(USES_POINTER)[kind]
    log_prob = (
        kind_lp
        + jnp.where(uses_tiles, tile_lp.sum(-1), 0.0)
        + jnp.where(uses_pointer, pointer_lp, 0.0)
    )
    entropy = (
        kind_ent
        + jnp.where(uses_tiles, tile_ent.sum(-1), 0.0)
        + jnp.where(uses_pointer, pointer_ent, 0.0)
    )
    return log_prob, entropy


def act(
    graphdef,
    params,
    obs: Observation,
    key: jax.Array,
    greedy: bool = False,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sample (or, `greedy`, take the most likely) actions for a batch of observations:
    (actions (B, ACTION_WIDTH) int32, their log-probabilities, the values). A `temperature`
    above 1 samples from flattened distributions (masked choices stay impossible); the
    log-probabilities are the policy's own."""
    network = nnx.merge(graphdef, params)
    encoding = network.encode(obs)
    kind_key, tile_key, pointer_key = jax.random.split(key, 3)
    kind_logits = _masked(network.kind_logits(encoding), obs.mask.kind)
    kind = (
        jnp.argmax(kind_logits, axis=-1)
        if greedy
        else jax.random.categorical(kind_key, kind_logits / temperature, axis=-1)
    )
    dist = distribution(network, encoding, obs, kind)
    if greedy:
        tiles, pointer = jnp.argmax(dist.tiles, axis=-1), jnp.argmax(dist.pointer, axis=-1)
    else:
        tiles = jax.random.categorical(tile_key, dist.tiles / temperature, axis=-1)
        pointer = jax.random.categorical(pointer_key, dist.pointer / temperature, axis=-1)
    action = jnp.concatenate([kind[..., None], pointer[..., None], tiles], axis=-1)
    action = action.astype(jnp.int32)
    log_prob, _ = log_prob_entropy(dist, action)
    return action, log_prob, network.value(encoding)


def evaluate_actions(
    graphdef, params, obs: Observation, action: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log-probabilities, entropies, values) of given actions under the network."""
    network = nnx.merge(graphdef, params)
    encoding = network.encode(obs)
    dist = distribution(network, encoding, obs, action[..., 0])
    log_prob, entropy = log_prob_entropy(dist, action)
    return log_prob, entropy, network.value(encoding)


def value(graphdef, params, obs: Observation) -> jax.Array:
    """The value head alone."""
    network = nnx.merge(graphdef, params)
    return network.value(network.encode(obs))
